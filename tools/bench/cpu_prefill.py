"""CPU prefill, side by side: mlx-lm's own forward, swama's CPU path and PyTorch, on the same weights.

    python -m tools.bench.cpu_prefill [--model-dir DIR] [--tokens 1052] [--rounds 5] [--write [docs/benchmarks.md]]

One process per side, in alternating order every round (mlx-lm, swama, PyTorch; then reversed),
each with the tuned BLAS swama preloads. Every side reads the same `--tokens` token ids of the
SmolLM2 test model in float32 into a fresh cache and computes only the cache (as a decision prefix
or a prompt is read): MLX in the scheduler's 512-token chunks, PyTorch (transformers,
`attn_implementation="sdpa"`) in one forward, `torch.inference_mode`. Reported: the median tokens/s
over the rounds and their spread, and where one MLX forward's time goes (a per-operation table of
one layer on a 512-token chunk).

The table under it is the reproducer for the part that lies inside MLX: its CPU `exp` against
`power`, numpy and PyTorch on 10 M float32 values (the same array), which is what makes MLX's own
attention softmax and SiLU slow on x86 Linux.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tools.bench.common import (
    add_write_option,
    default_model_dir,
    machine_facts,
    markdown_table,
    missing_model_message,
    package_version,
    publish,
    server_env,
    today,
)

TITLE = "CPU prefill: mlx-lm's forward vs swama's CPU path vs PyTorch"
SIDES = ("mlx-lm", "swama", "pytorch")

CHILD = r"""
import json, sys, time
side, folder, tokens, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ids = [(i * 7919) % 40000 + 100 for i in range(tokens)]
times = []
if side == "pytorch":
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(__import__("os").cpu_count())
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="sdpa")
    body = model.model
    x = torch.tensor([ids])
    with torch.inference_mode():
        for i in range(runs + 1):
            start = time.perf_counter(); body(x, use_cache=True); times.append(time.perf_counter() - start)
else:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache
    model, _ = load(folder); model.set_dtype(mx.float32); mx.eval(model.parameters())
    if side == "swama":
        from swama.engine.text.cpu_forward import install
        assert install(model)
    x = mx.array([ids])
    for i in range(runs + 1):
        cache = make_prompt_cache(model)
        start = time.perf_counter()
        for at in range(0, tokens, 512):
            model.model(x[:, at:at + 512], cache=cache)
            mx.eval([c.state for c in cache])
        times.append(time.perf_counter() - start)
print(json.dumps({"seconds": times[1:]}))
"""

OPS_CHILD = r"""
import json, time
import mlx.core as mx, numpy as np
out = {}
x = mx.random.normal((10_000_000,)); mx.eval(x)
def best(f, n=5):
    b = float("inf")
    for _ in range(n):
        s = time.perf_counter(); mx.eval(f()); b = min(b, time.perf_counter() - s)
    return b * 1000
out["mlx exp"] = best(lambda: mx.exp(x))
out["mlx power(2, x)"] = best(lambda: mx.power(2.0, x))
out["mlx multiply"] = best(lambda: x * 1.5)
xn = np.array(x)
def nbest(f, n=5):
    b = float("inf")
    for _ in range(n):
        s = time.perf_counter(); f(); b = min(b, time.perf_counter() - s)
    return b * 1000
out["numpy exp"] = nbest(lambda: np.exp(xn))
try:
    import torch
    xt = torch.from_numpy(xn)
    out["pytorch exp"] = nbest(lambda: torch.exp(xt))
except ImportError:
    pass
print(json.dumps(out))
"""


def run_child(code: str, *args: str) -> dict:
    env = server_env()  # the BLAS swama preloads, as for every server
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--tokens", type=int, default=1052)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2, help="timed forwards per process, after one warm-up")
    add_write_option(parser)
    args = parser.parse_args(argv)
    if args.model_dir is None:
        sys.exit(missing_model_message())
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(args.rounds):
        for side in SIDES if r % 2 == 0 else tuple(reversed(SIDES)):
            got = run_child(CHILD, side, str(args.model_dir), str(args.tokens), str(args.runs))
            rates[side].append(args.tokens / statistics.median(got["seconds"]))
            print(f"round {r + 1} {side}: {rates[side][-1]:.0f} tok/s", flush=True)
    ops = run_child(OPS_CHILD)
    rows = []
    for side in SIDES:
        values = rates[side]
        rows.append([side, f"{statistics.median(values):.0f}", f"{min(values):.0f}–{max(values):.0f}",
                     f"{statistics.median(values) / statistics.median(rates['pytorch']):.2f}x"])
    table = markdown_table(["forward", "tok/s (median)", "spread over rounds", "vs PyTorch"], rows)
    op_rows = [[name, f"{ms:.1f}", f"{10_000 / ms:.0f}"] for name, ms in ops.items()]
    op_table = markdown_table(["10 M float32 values", "ms (best of 5)", "M values/s"], op_rows)
    facts = machine_facts()
    versions = ", ".join(f"{p} {package_version(p)}" for p in ("mlx", "mlx-lm", "torch", "transformers"))
    command = "python -m tools.bench.cpu_prefill " + " ".join(argv if argv is not None else sys.argv[1:])
    body = (f"Measured {today()} with `{command.strip()}` on {os.cpu_count()} CPUs (BLAS preloaded: {facts['blas preloaded']}; {facts['processor']}); "
            f"{versions}. SmolLM2-135M-Instruct in float32, {args.tokens} tokens into a fresh cache, "
            f"{args.rounds} rounds in alternating order, each figure the median of the rounds.\n\n{table}\n\n"
            f"Inside MLX (the reproducer for an upstream report: `mx.exp` on 10 M float32 values against "
            f"`mx.power(2.0, x)`, a plain multiply, numpy and PyTorch on the same values and cores):\n\n{op_table}")
    publish(TITLE, body, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
