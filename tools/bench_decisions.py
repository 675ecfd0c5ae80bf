"""Decision scoring speed: shared-prefix scoring against a fresh cache per question, in one run.

    python -m swama.tools.bench_decisions [--model-dir DIR] [--runs N] [--write docs/benchmarks.md]
    python -m swama.tools.bench_decisions --hybrid [--model-dir DIR] [--runs N] [--write]

Measures 20 questions over a ~1,000-token input both ways (same model, same process, alternating
runs), checks both ways agree within 1e-4, and questions per second for 1, 10 and 50 questions.
`--hybrid` measures the same 20 questions on a tiny random Qwen3.5-style hybrid model (built from
the model folder's tokenizer), whose cache cannot be trimmed: prefix snapshot vs fresh cache.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from swama.engine.decide import DecisionJob, DecisionRun
from swama.engine.model import load_language_model
from swama.engine.runtime import reexec_with_openblas
from swama.engine.scorer import decision_choice_view, decision_score_view, predicate_view
from swama.tools.bench_common import default_model_dir, missing_model_message, today, write_section

TITLE = "Decisions: shared-prefix scoring vs a fresh cache per question"
HYBRID_TITLE = "Decisions on a hybrid model: prefix snapshot vs a fresh cache per question"


def ticket(target_tokens: int, tokenizer) -> str:
    lines, text = [], ""
    i = 0
    while len(tokenizer.encode(text)) < target_tokens:
        i += 1
        lines.append(f"Message {i}: the customer says the invoice for order {1000 + i} was charged twice "
                     f"and asks for a refund to the original card before the end of the month.")
        text = "\n".join(lines)
    return text


def questions(n: int) -> list:
    pool = [
        predicate_view("Is this a billing issue?"),
        decision_choice_view("Which team should handle this?", [("billing", None), ("technical", None),
                                                                 ("sales", None)]),
        decision_score_view("How urgent is it?", [("low", None), ("medium", None), ("high", "needs action today")]),
        predicate_view("Does the customer ask for a refund?"),
        decision_choice_view("What is the tone?", [("calm", None), ("angry", "upset"), ("neutral", None)]),
    ]
    return [pool[i % len(pool)] for i in range(n)]


def timed(model, job: DecisionJob, reuse: bool) -> tuple[float, object]:
    start = time.perf_counter()
    run = DecisionRun(model, job, prefix_reuse=reuse)
    run.start()
    while not run.done:
        run.score_next()
    return time.perf_counter() - start, run.result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", type=Path, nargs="?", const=Path(__file__).resolve().parent.parent / "docs"
                        / "benchmarks.md", default=None, help="update this section of docs/benchmarks.md")
    parser.add_argument("--hybrid", action="store_true",
                        help="a tiny random Qwen3.5-style hybrid model: prefix snapshot vs fresh cache")
    args = parser.parse_args(argv)
    if args.model_dir is None or not (args.model_dir / "config.json").exists():
        parser.error(missing_model_message())
    reexec_with_openblas(sys.argv[1:] if argv is None else argv, module="swama.tools.bench_decisions")
    if args.hybrid:
        return hybrid(args)
    load = f"{os.getloadavg()[0]:.1f}"
    model = load_language_model("bench", args.model_dir)
    text = ticket(1000, model.tokenizer)
    job = DecisionJob(text, questions(20), 16384)
    timed(model, DecisionJob(text, questions(2), 16384), True)  # warm-up

    s, f, worst, _ = _compare(model, job, args.runs)
    rows = [("20 questions, shared prefix", f"{s:.2f} s", f"{20 / s:.1f}"),
            ("20 questions, fresh cache each", f"{f:.2f} s", f"{20 / f:.1f}")]
    for n in (1, 10, 50):
        t, _ = timed(model, DecisionJob(text, questions(n), 16384), True)
        rows.append((f"{n} question{'s' if n > 1 else ''}, shared prefix", f"{t:.2f} s", f"{n / t:.1f}"))

    preload = "openblas" in os.environ.get("LD_PRELOAD", "")
    lines = [
        f"Measured {today()} with `python -m swama.tools.bench_decisions --runs {args.runs} --write` "
        f"(median of {args.runs} alternating runs, one process), SmolLM2-135M-Instruct float32, input "
        f"{len(model.tokenizer.encode(text))} tokens; {os.cpu_count()} CPUs, {platform.machine()}, "
        f"OpenBLAS preloaded: {'yes' if preload else 'no'}, load average before the run: {load}.", "",
        "| case | time | questions/s |", "|---|---:|---:|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows], "",
        f"**Shared prefix is {f / s:.1f}x faster** than a fresh cache per question (target: 8x). "
        f"Largest probability difference between the two ways: {worst:.1e} (bound: 1e-4).", "",
    ]
    return _publish(TITLE, lines, args.write)


def _publish(title: str, lines: list[str], write: Path | None) -> int:
    print(f"## {title}\n\n" + "\n".join(lines))
    if write:
        write_section(write, title, "\n".join(lines))
    return 0


def _compare(model, job: DecisionJob, runs: int) -> tuple[float, float, float, int]:
    """Median seconds shared and fresh, the largest probability difference, the shared prefix length."""
    shared_t, fresh_t, worst, prefix = [], [], 0.0, 0
    for _ in range(runs):
        t_shared, shared = timed(model, job, True)
        t_fresh, fresh = timed(model, job, False)
        shared_t.append(t_shared)
        fresh_t.append(t_fresh)
        prefix = shared.shared_prefix_tokens
        for a, b in zip(shared.answers, fresh.answers, strict=True):
            worst = max(worst, *(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True)))
    return statistics.median(shared_t), statistics.median(fresh_t), worst, prefix


def hybrid(args: argparse.Namespace) -> int:
    import tempfile

    from swama.tools.build_tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_model(args.model_dir, Path(tmp) / "tiny-qwen3_5", arch="qwen3_5")
        model = load_language_model("bench-hybrid", folder)
        text = ticket(1000, model.tokenizer)
        job = DecisionJob(text, questions(20), 16384)
        timed(model, DecisionJob(text, questions(2), 16384), True)  # warm-up
        s, f, worst, prefix = _compare(model, job, args.runs)
    lines = [
        f"Measured {today()} with `python -m swama.tools.bench_decisions --hybrid --runs {args.runs} --write` "
        f"(median of {args.runs} alternating runs, one process): a tiny random-weight Qwen3.5-style model "
        f"(4 layers, linear attention with full attention every second layer; its cache cannot be trimmed), "
        f"20 questions over a {len(model.tokenizer.encode(text))}-token input, shared prefix {prefix} tokens; "
        f"{os.cpu_count()} CPUs, {platform.machine()}.", "",
        "| case | time | questions/s |", "|---|---:|---:|",
        f"| 20 questions, prefix snapshot restored per question | {s:.3f} s | {20 / s:.1f} |",
        f"| 20 questions, fresh cache each | {f:.3f} s | {20 / f:.1f} |", "",
        f"**Prefix snapshot is {f / s:.1f}x faster** than a fresh cache per question. Largest probability "
        f"difference between the two ways: {worst:.1e} (bound: 1e-4).", "",
    ]
    return _publish(HYBRID_TITLE, lines, args.write)


if __name__ == "__main__":
    raise SystemExit(main())
