"""CPU BLAS choices side by side: MLX's bundled reference BLAS, the system OpenBLAS and MKL's wheel.

    python -m tools.bench.blas [--write docs/benchmarks.md]

Each BLAS is preloaded into a fresh child process the way swama preloads it (LD_PRELOAD plus what
the library needs), which then measures a float32 1024x1024 matmul and, on the SmolLM2 test model
(when the test cache holds it), greedy decoding of one stream, decode steps of 8 rows at once (what
8 concurrent clients cost) and a 512-token prefill. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from swama.engine import runtime
from tools.bench.common import (
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
tok_s = batch_tok_s = prefill_tok_s = None
if sys.argv[1]:
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache
    model, tok = load(sys.argv[1]); model.set_dtype(mx.float32)
    ids = mx.array(tok.encode("Tell me about the sea."))
    for _, (t, _) in zip(range(4), generate_step(ids, model)): pass
    start = time.perf_counter(); count = 0
    for count, (t, _) in enumerate(generate_step(ids, model), 1):
        if count == 32: break
    tok_s = count / (time.perf_counter() - start)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(100, 164))] * 8), cache=cache))
    step = mx.array([[7]] * 8)
    for _ in range(3): mx.eval(model(step, cache=cache))
    start = time.perf_counter()
    for _ in range(16): mx.eval(model(step, cache=cache))
    batch_tok_s = 8 * 16 / (time.perf_counter() - start)
    prompt = mx.array([list(range(100, 612))]); best = float("inf")
    for _ in range(3):
        start = time.perf_counter(); mx.eval(model(prompt, cache=make_prompt_cache(model))[:, -1])
        best = min(best, time.perf_counter() - start)
    prefill_tok_s = 512 / best
print(json.dumps({"blas": loaded_blas(), "gflops": gflops, "tok_s": tok_s, "batch_tok_s": batch_tok_s,
                  "prefill_tok_s": prefill_tok_s}))
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
            rows.append([name, "not installed", "", "", "", ""])
            continue
        got = _measure(name, blas, model)
        base = base or got
        figures = [f"{got[key]:.1f}" if got[key] else "n/a" for key in ("tok_s", "batch_tok_s", "prefill_tok_s")]
        rows.append([name, f"{got['gflops']:.1f}", *figures, f"{got['gflops'] / base['gflops']:.1f}x"])
    table = markdown_table(["BLAS", "fp32 1024² matmul GFLOP/s", "SmolLM2 fp32 decode tok/s (1 row)",
                            "decode tok/s (8 rows)", "prefill tok/s (512 tokens)", "matmul vs bundled"], rows)
    body = (f"Measured {today()} with `python -m tools.bench.blas` ({os.cpu_count()} CPUs), each BLAS "
            f"preloaded into a fresh process as swama does it. With `SWAMA_BLAS=auto` swama preloads MKL's "
            f"wheel when it is installed, else the system OpenBLAS.\n\n{table}")
    publish(TITLE, body, args.write)


if __name__ == "__main__":
    main()
