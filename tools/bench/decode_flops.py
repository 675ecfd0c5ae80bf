"""Batched decode against the machine's float32 matmul ceiling, in one run.

    python -m tools.bench.decode_flops [--model-dir DIR] [--rows 1,8] [--steps N] [--write [MD]]

The ceiling is the best GFLOP/s of large float32 matmuls (MLX, the BLAS it runs on); the decode
figure is 2 x parameters x tokens per second of the batch scheduler's decode steps at each batch
size (attention over the short context adds little and is left out, so the fraction errs low).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from swama.engine.runtime import reexec_with_fast_blas
from tools.bench.chat import resolve_model_dir
from tools.bench.common import (
    BENCHMARKS_MD,
    facts_lines,
    machine_facts,
    markdown_table,
    today,
    write_section,
)

SECTION = "Batched decode vs the float32 matmul ceiling"


def matmul_ceiling(size: int = 2048, repeats: int = 6) -> float:
    import mlx.core as mx

    a = mx.random.normal((size, size))
    b = mx.random.normal((size, size))
    mx.eval(a, b)
    mx.eval(a @ b)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(a @ b)
        best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e9)
    return best


def decode_rate(model_dir: Path, rows: int, steps: int) -> tuple[float, int]:
    """Decode tokens per second with `rows` rows, and the model's parameter count."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.generate import BatchGenerator

    from swama.engine.text.language import load_language_model

    model = load_language_model("bench", model_dir)
    params = sum(v.size for _, v in tree_flatten(model.model.parameters()))
    gen = BatchGenerator(model.model, completion_batch_size=rows, prefill_batch_size=rows,
                         stream=mx.default_stream(mx.default_device()))
    prompt = model.tokenizer.encode("Write a long story about a lighthouse keeper.")
    gen.insert([prompt + [i] for i in range(rows)], max_tokens=[steps + 8] * rows)
    while len(gen._generation_batch) < rows:  # prefill all rows first
        gen.next()
    for _ in range(4):
        gen.next()  # warm-up decode steps
    start = time.perf_counter()
    for _ in range(steps):
        gen.next()
    elapsed = time.perf_counter() - start
    gen.close()
    return rows * steps / elapsed, params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.decode_flops", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--rows", type=lambda v: [int(x) for x in v.split(",")], default=[1, 8])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--write", nargs="?", type=Path, const=BENCHMARKS_MD, default=None, metavar="MD")
    args = parser.parse_args(argv)
    reexec_with_fast_blas(sys.argv[1:] if argv is None else argv, module="tools.bench.decode_flops")
    model_dir = resolve_model_dir(args.model_dir)
    command = shlex.join(["python", "-m", "tools.bench.decode_flops", *(sys.argv[1:] if argv is None else argv)])
    ceiling = matmul_ceiling()
    rows = []
    for n in args.rows:
        rate, params = decode_rate(model_dir, n, args.steps)
        achieved = 2 * params * rate / 1e9
        rows.append([str(n), f"{rate:.1f}", f"{achieved:.1f}", f"{ceiling:.1f}", f"{achieved / ceiling:.1%}"])
        print(f"{n} rows: {rate:.1f} tok/s, {achieved:.1f} GFLOP/s of {ceiling:.1f}", flush=True)
    text = "\n\n".join([
        f"Decode steps of the batch scheduler's generator on `{model_dir.name}` in float32, against the best "
        f"of 2048x2048 float32 matmuls on the same machine. Measured {today()} with:\n\n```\n{command}\n```",
        markdown_table(["rows", "decode tok/s", "GFLOP/s achieved", "matmul ceiling GFLOP/s", "fraction"], rows),
        "GFLOP/s achieved: 2 x parameters x tokens per second (attention over the short context left out).",
        "Machine:\n\n" + facts_lines(machine_facts()),
    ])
    print("\n" + text)
    if args.write is not None:
        write_section(args.write, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
