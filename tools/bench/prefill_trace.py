"""What tracing a prefill forward would buy: mlx-lm's forward over a fresh cache, plain and under
`mx.compile`, on a random model of a real shape, in one process.

    python -m tools.bench.prefill_trace [--shape qwen3-0.6b] [--sizes 1x128,1x1024,8x128,1x4096] [--runs 4]

A fresh cache's offsets are the same every call, so the forward traces. For each rows x tokens
size it reports, medians of `--runs` after two warm-ups: host time building the graph, the time
`mx.async_eval` takes to encode the kernels (`launch`), the whole forward, and tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def _forward(model: Any) -> Any:
    def forward(tokens: Any) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(model)
        logits = model(tokens, cache=cache)
        return [logits[:, -1]] + [a for c in cache for a in c.state if a is not None]

    return forward


def timed(fn: Any, tokens: Any, runs: int) -> tuple[float, float, float]:
    import mlx.core as mx

    marks = []
    for i in range(runs + 2):
        mx.synchronize()
        t0 = time.perf_counter()
        out = fn(tokens)
        t1 = time.perf_counter()
        mx.async_eval(out)
        t2 = time.perf_counter()
        mx.eval(out)
        t3 = time.perf_counter()
        if i >= 2:
            marks.append((t1 - t0, t2 - t1, t3 - t0))
        del out
    return tuple(statistics.median(m[k] for m in marks) * 1e3 for k in range(3))  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-0.6b", help="a shape of tools/testmodels/tiny.py")
    parser.add_argument("--sizes", default="1x128,1x512,1x1024,8x128,4x1024,1x4096", help="rows x tokens, comma-separated")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args(argv)
    import mlx.core as mx

    from swama.engine.runtime import activate_device
    from tools.bench.decode_step import build

    activate_device()
    model = build(args.shape)
    plain = _forward(model)
    compiled = mx.compile(plain)
    print("| rows x tokens | plain ms (graph, launch) | compiled ms (graph, launch) | plain tok/s | compiled tok/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for size in args.sizes.split(","):
        rows, length = (int(x) for x in size.split("x"))
        tokens = mx.random.randint(0, 1000, (rows, length))
        (pg, pl, pt), (cg, cl, ct) = timed(plain, tokens, args.runs), timed(compiled, tokens, args.runs)
        print(f"| {rows} x {length:,} | {pt:.2f} ({pg:.2f}, {pl:.2f}) | {ct:.2f} ({cg:.2f}, {cl:.2f}) | "
              f"{rows * length / pt * 1e3:,.0f} | {rows * length / ct * 1e3:,.0f} |", flush=True)
        mx.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
