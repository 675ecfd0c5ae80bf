"""What a decision request's forward passes cost on a GPU, and what packing them changes.

    python -m tools.bench.decision_packing [--shape qwen3-0.6b] [--models-dir DIR] [--donor DIR]
                                           [--runs 5] [--requests 1,8,16,32]

Every figure is the median of `--runs` repeats of one shape after a warm-up of that shape, unless
it says "new shape": then each repeat has shapes not seen before (its prefixes a few tokens longer),
as a server meets them. Each request is 20 questions (10 predicates, 10 four-way choices, as
tools.bench.load sends) over its own ~1,000-token input.

- attention alone: MLX's fused attention over a 1,000-token prefix, causal mask against an additive
  mask array, warm and at a new length (MLX builds a cuDNN graph per new shape);
- one forward of 64 tokens: the cost of a pass whatever its size;
- prefixes of N requests: one forward each (as the scheduler read them until now), packed left-padded
  with a mask array (mlx-lm's batch cache, the earlier attempt), packed right-padded under the causal
  mask (engine/decisions/packed_prefill.py);
- a scoring pass over all questions of N requests: each row with its own copy of its prefix, left-padded
  (the GPU's pass until now), and the suffixes attending their prefixes in place in one fused call per
  layer (engine/decisions/shared_prefix.py);
- one request alone: prefix and one pass, both ways.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.bench.common import test_cache_dir

QUESTIONS = 20


def median_ms(fn: Callable[[], Any], runs: int, warm: bool = True) -> tuple[float, float, float]:
    """(median, min, max) milliseconds of `fn` (which evaluates its own work)."""
    if warm:
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times), max(times)


def fmt(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.1f} ({t[1]:.1f}-{t[2]:.1f})"


def make_runs(model: Any, count: int, salt: int) -> list[Any]:
    """`count` prepared runs, each over its own input; `salt` lengthens every input by a few tokens,
    so a new salt gives new shapes."""
    from swama.engine.decisions.decide import DecisionJob, DecisionRun
    from swama.engine.decisions.scorer import decision_choice_view, predicate_view
    from tools.bench.load import ticket_text

    text = ticket_text(1000)
    runs = []
    for c in range(count):
        views = [predicate_view(f"Does the customer mention problem {i}?") if i % 2 == 0 else
                 decision_choice_view(f"Which team should take point {i}?",
                                      [("billing", None), ("technical", None), ("sales", None), ("other", None)])
                 for i in range(QUESTIONS)]
        extra = " ".join(["note"] * (salt * 3 + c % 4))
        run = DecisionRun(model, DecisionJob(f"Client {c} {extra}\n{text}", views, 16384))
        run.prepare()
        runs.append(run)
    return runs


def attention_alone(runs: int) -> list[str]:
    import mlx.core as mx

    lines = []
    for length in (1000,):
        q = mx.random.normal((1, 16, length, 128)).astype(mx.bfloat16)
        k = mx.random.normal((1, 8, length, 128)).astype(mx.bfloat16)
        v = mx.random.normal((1, 8, length, 128)).astype(mx.bfloat16)
        causal = mx.triu(mx.full((length, length), -mx.inf, mx.bfloat16), k=1)
        mx.eval(q, k, v, causal)
        for name, mask in (("causal", "causal"), ("mask array", causal)):
            def attend(q: Any = q, k: Any = k, v: Any = v, m: Any = mask) -> None:
                mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=0.1, mask=m))

            t = median_ms(attend, runs)
            lines.append(f"| attention, {length} tokens, {name}, warm | {fmt(t)} |")
    fresh = []
    for n in range(runs):
        length = 1003 + n
        q = mx.random.normal((1, 16, length, 128)).astype(mx.bfloat16)
        k = mx.random.normal((1, 8, length, 128)).astype(mx.bfloat16)
        mx.eval(q, k)
        start = time.perf_counter()
        mx.eval(mx.fast.scaled_dot_product_attention(q, k, k, scale=0.1, mask="causal"))
        fresh.append((time.perf_counter() - start) * 1e3)
    lines.append(f"| attention, causal, new shape | {fmt((statistics.median(fresh), min(fresh), max(fresh)))} |")
    return lines


def one_forward(model: Any, runs: int) -> list[str]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    tokens = mx.array([list(range(100, 164))])
    t = median_ms(lambda: mx.eval(model.model(tokens, cache=make_prompt_cache(model.model))), runs)
    return [f"| one forward, 64 tokens | {fmt(t)} |"]


def prefill_left_padded(runs: list[Any]) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from swama.engine.decisions.heads import fill_cache

    width = max(r.prefix for r in runs)
    tokens = mx.array([[0] * (width - r.prefix) + r.prepared[0].ids[:r.prefix] for r in runs])
    cache = [BatchKVCache([width - r.prefix for r in runs]) for _ in range(len(runs[0]._cache()))]
    fill_cache(runs[0].net, tokens, cache)


def prefixes(model: Any, counts: list[int], runs: int) -> list[str]:
    from swama.engine.decisions.packed_prefill import GPU_WIDTH_STEP, prefill_pack

    lines = []
    for count in counts:
        same = make_runs(model, count, 0)
        ways = {
            "one forward each": lambda rs=same: [r.prefill() for r in rs] and _sync(rs),
            "packed, left-padded, mask array": lambda rs=same: prefill_left_padded(rs),
            "packed, right-padded, causal": lambda rs=same: prefill_pack(rs, GPU_WIDTH_STEP) or _sync(rs),
        }
        for name, fn in ways.items():
            t = median_ms(fn, runs)
            lines.append(f"| prefixes of {count}: {name} | {fmt(t)} | {t[0] / count:.2f} |")
        for name, fn in (("one forward each, new shapes", lambda rs: [r.prefill() for r in rs] and _sync(rs)),
                         ("packed, right-padded, new shapes", lambda rs: prefill_pack(rs, GPU_WIDTH_STEP) or _sync(rs))):
            fresh = []
            for salt in range(1, runs + 1):
                rs = make_runs(model, count, salt * 7 + count)
                start = time.perf_counter()
                fn(rs)
                fresh.append((time.perf_counter() - start) * 1e3)
            t = (statistics.median(fresh), min(fresh), max(fresh))
            lines.append(f"| prefixes of {count}: {name} | {fmt(t)} | {t[0] / count:.2f} |")
    return lines


def _sync(runs: list[Any]) -> None:
    import mlx.core as mx

    mx.eval([c.keys for r in runs for c in (r.shared or [])])


def passes(model: Any, counts: list[int], runs: int) -> list[str]:
    import mlx.core as mx

    from swama.engine.decisions.decide import launch_across, pick_rows
    from swama.engine.decisions.packed_prefill import GPU_WIDTH_STEP, prefill_pack
    from swama.engine.serving.scheduler import GPU_DECISION_ROWS

    lines = []
    for count in counts:
        rs = make_runs(model, count, 0)
        prefill_pack(rs, GPU_WIDTH_STEP)
        answers: dict[str, dict[tuple[int, int], Any]] = {}
        for name, in_place in (("copies of the prefix per row, left-padded", False),
                               ("in place, one fused call a layer", True)):
            rs[0].state.in_place = in_place  # the model's scorer state: it picks the pass's way
            for r in rs:
                r.launched = 0
            rows = pick_rows(rs, GPU_DECISION_ROWS)

            def one(rows: list[Any] = rows, rs: list[Any] = rs) -> Any:
                for r in rs:
                    r.launched = 0
                return launch_across(rows).rows()

            t = median_ms(one, runs)
            answers[name] = {(id(r), id(q)): got for (r, q), got in zip(rows, one(), strict=True)}
            per_question = t[0] / len(rows)
            lines.append(f"| pass over {len(rows)} questions of {count}: {name} | {fmt(t)} | "
                         f"{per_question * QUESTIONS:.2f} | |")
        first, second = answers.values()
        common = first.keys() & second.keys()
        worst = max((abs(a - b) for key in common for a, b in zip(first[key].labels, second[key].labels, strict=True)),
                    default=0.0)
        lines[-1] = lines[-1][:-2] + f"{worst:.3g} |"
        mx.clear_cache()
    return lines


def one_request(model: Any, runs: int) -> list[str]:
    from swama.engine.decisions.decide import launch_across, pick_rows
    from swama.engine.decisions.packed_prefill import GPU_WIDTH_STEP, prefill_pack

    lines = []
    salts = iter(range(1, 1000))
    for name, in_place, salted in (("copies", False, False), ("packed prefix, in place, fused", True, False),
                                   ("packed prefix, in place, fused, new lengths", True, True)):
        def request(in_place: bool = in_place, salted: bool = salted) -> None:
            [run] = make_runs(model, 1, next(salts) if salted else 0)
            run.state.in_place = in_place
            if in_place:
                prefill_pack([run], GPU_WIDTH_STEP)
            else:
                run.prefill()
            launch_across(pick_rows([run], QUESTIONS)).rows()

        lines.append(f"| one request, {name} (preparation included) | {fmt(median_ms(request, runs))} |")
    lines.append(f"| one request's preparation alone | {fmt(median_ms(lambda: make_runs(model, 1, 0), runs))} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--models-dir", type=Path, default=test_cache_dir() / "bench-gpu")
    parser.add_argument("--donor", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", default="1,8,16,32")
    parser.add_argument("--parts", default="attention,forward,prefixes,passes,request")
    args = parser.parse_args(argv)
    import mlx.core as mx

    from swama.engine.text.language import load_language_model
    from tools.bench.gpu import build_shape, find_donor

    donor = find_donor(args.donor, args.models_dir)
    folder = build_shape(args.shape, args.models_dir, donor)
    model = load_language_model(args.shape, folder)
    counts = [int(c) for c in args.requests.split(",")]
    parts = args.parts.split(",")
    print(f"mlx {mx.__version__}, {mx.default_device()}, {args.shape}", flush=True)
    print("| what | ms: median (min-max) | ms per request | largest label logit difference |")
    print("| --- | ---: | ---: | ---: |", flush=True)
    for part, fn in (("attention", lambda: attention_alone(args.runs)), ("forward", lambda: one_forward(model, args.runs)),
                     ("prefixes", lambda: prefixes(model, counts, args.runs)),
                     ("passes", lambda: passes(model, counts, args.runs)), ("request", lambda: one_request(model, args.runs))):
        if part in parts:
            for line in fn():
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
