"""What a new prefill shape costs on this device: the first forward of each (rows, length) against
the same forward again, and waves of prompts of random lengths read by the admission with exact
shapes (as mlx-lm's batch reads them) against the small set of shapes it uses on a GPU.

    python -m tools.bench.prefill_shapes --model-dir DIR [--waves 4] [--prompts 32]

On an NVIDIA GPU MLX builds a cuDNN attention graph for every new shape of a prefill's attention,
with the device idle while it is built; with shapes from a small set each is built once. On the CPU
nothing is built per shape (the first and second calls cost the same).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def forward(model: Any, rows: int, length: int) -> float:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    tokens = mx.random.randint(5, 1000, (rows, length))
    started = time.perf_counter()
    model(tokens, cache=cache)
    mx.eval([c.state for c in cache])
    return time.perf_counter() - started


def wave(model: Any, prompts: list[list[int]], bucketed: bool, budget: int) -> tuple[float, int]:
    """Seconds to read every prompt, and the forwards it took."""
    from mlx_lm.models.cache import make_prompt_cache

    from swama.engine.serving.admission import Admission, Pending

    admission = Admission(model, budget, bucketed, max_rows=len(prompts))
    for i, ids in enumerate(prompts):
        admission.add(Pending(i, ids, make_prompt_cache(model), 0))
    started, forwards = time.perf_counter(), 0
    while len(admission):
        admission.step()
        forwards += 1
    return time.perf_counter() - started, forwards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--budget", type=int, default=4096, help="prefill tokens a forward reads")
    args = parser.parse_args(argv)

    import mlx.core as mx
    from mlx_lm import load

    from swama.engine.runtime import activate_device, compute_dtype

    print("device:", activate_device(), flush=True)
    model, _ = load(str(args.model_dir))
    model.set_dtype(compute_dtype())
    mx.eval(model.parameters())
    forward(model, 1, 16)
    print("\n| rows | length | first forward ms | again ms | first - again ms |\n| ---: | ---: | ---: | ---: | ---: |")
    for rows, length in [(1, 37), (1, 41), (8, 37), (8, 45), (3, 50), (8, 64), (16, 64), (64, 64)]:
        first, again = forward(model, rows, length), forward(model, rows, length)
        print(f"| {rows} | {length} | {first * 1000:,.1f} | {again * 1000:,.1f} | {(first - again) * 1000:,.1f} |",
              flush=True)
    rng = random.Random(1)
    print("\n| wave | exact shapes s (forwards) | small set of shapes s (forwards) |\n| ---: | ---: | ---: |")
    exact, small = [], []
    for n in range(args.waves):
        prompts = [[rng.randrange(5, 1000) for _ in range(rng.randrange(20, 90))] for _ in range(args.prompts)]
        e, fe = wave(model, prompts, False, args.budget)
        s, fs = wave(model, prompts, True, args.budget)
        exact.append(e)
        small.append(s)
        print(f"| {n + 1} | {e:.3f} ({fe}) | {s:.3f} ({fs}) |", flush=True)
    print(f"\nmedian wave: exact {statistics.median(exact):.3f} s, small set {statistics.median(small):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
