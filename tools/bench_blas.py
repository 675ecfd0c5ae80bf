"""CPU BLAS choices side by side: MLX's bundled reference BLAS, the system OpenBLAS and MKL's wheel.

    python -m swama.tools.bench_blas [--write docs/benchmarks.md]

Each BLAS is preloaded into a fresh child process the way swama preloads it (LD_PRELOAD plus what
the library needs), which then measures a float32 1024x1024 matmul and greedy decoding of the
SmolLM2 test model (when the test cache holds it). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from swama.engine import runtime
from swama.tools.bench_common import (
    add_write_option,
    default_model_dir,
    markdown_table,
    publish,
    today,
)

TITLE = "CPU BLAS: bundled reference BLAS vs system OpenBLAS vs MKL from PyPI"

CHILD = r"""
import json, sys, time
import mlx.core as mx
from swama.engine.runtime import loaded_blas
a = mx.random.normal((1024, 1024)); b = mx.random.normal((1024, 1024)); mx.eval(a, b)
for _ in range(3): mx.eval(a @ b)
n = 10; start = time.perf_counter()
for _ in range(n): mx.eval(a @ b)
gflops = 2 * 1024 ** 3 / ((time.perf_counter() - start) / n) / 1e9
tok_s = None
if sys.argv[1]:
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    model, tok = load(sys.argv[1]); model.set_dtype(mx.float32)
    ids = mx.array(tok.encode("Tell me about the sea."))
    for _, (t, _) in zip(range(4), generate_step(ids, model)): pass
    start = time.perf_counter(); count = 0
    for count, (t, _) in enumerate(generate_step(ids, model), 1):
        if count == 32: break
    tok_s = count / (time.perf_counter() - start)
print(json.dumps({"blas": loaded_blas(), "gflops": gflops, "tok_s": tok_s}))
"""


def _measure(name: str, blas: runtime.Blas | None, model: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if blas is not None:
        env.update(blas.env)
        env["LD_PRELOAD"] = blas.library
    out = subprocess.run([sys.executable, "-c", CHILD, str(model or "")], env=env, capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_write_option(parser)
    args = parser.parse_args(argv)
    if sys.platform != "linux":
        sys.exit("BLAS preloading is a Linux matter")
    model = default_model_dir()
    choices = {"MLX's bundled BLAS": None, "system OpenBLAS": runtime.system_openblas(), "MKL (pip install mkl)":
               runtime.pip_mkl()}
    rows, base = [], None
    for name, blas in choices.items():
        if name != "MLX's bundled BLAS" and blas is None:
            rows.append([name, "not installed", "", ""])
            continue
        got = _measure(name, blas, model)
        base = base or got
        tok = f"{got['tok_s']:.1f}" if got["tok_s"] else "n/a"
        rows.append([name, f"{got['gflops']:.1f}", tok, f"{got['gflops'] / base['gflops']:.1f}x"])
    table = markdown_table(["BLAS", "fp32 1024² matmul GFLOP/s", "SmolLM2 fp32 decode tok/s", "matmul vs bundled"],
                           rows)
    body = (f"Measured {today()} with `python -m swama.tools.bench_blas` ({os.cpu_count()} CPUs), each BLAS "
            f"preloaded into a fresh process as swama does it. MKL's wheel is what swama preloads for a "
            f"user without root and without the system OpenBLAS.\n\n{table}")
    publish(TITLE, body, args.write)


if __name__ == "__main__":
    main()
