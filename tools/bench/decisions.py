"""Decision scoring speed: shared-prefix scoring against a fresh cache per question, in one run.

    python -m tools.bench.decisions [--model-dir DIR] [--runs N] [--write docs/benchmarks.md]
    python -m tools.bench.decisions --hybrid [--model-dir DIR] [--runs N] [--write]
    python -m tools.bench.decisions --vision [--model-dir DIR] [--runs N] [--write]
    python -m tools.bench.decisions --batched [--model-dir DIR] [--runs N] [--write]

Measures 20 questions over a ~1,000-token input both ways (same model, same process, alternating
runs), checks both ways agree within 1e-4, and questions per second for 1, 10 and 50 questions.
`--hybrid` measures the same 20 questions on a tiny random Qwen3.5-style hybrid model (built from
the model folder's tokenizer), whose cache cannot be trimmed: prefix snapshot vs fresh cache.
`--vision` measures 10 questions with two photo-sized images on a tiny random Qwen3.5 vision-language
model: one vision encoding and one prefix prefill per request vs both again for every question.
`--batched` measures the same 20 questions over the ~1,000-token input with the shared prefix both
ways: every suffix in one batched pass (`score_batch`) vs one pass per question (`score_next`),
and checks both ways give the same answers.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

from swama.engine.decisions.decide import DecisionJob, DecisionRun
from swama.engine.decisions.scorer import decision_choice_view, decision_score_view, predicate_view
from swama.engine.runtime import reexec_with_fast_blas
from swama.engine.text.language import load_language_model
from tools.bench.common import default_model_dir, missing_model_message, today, write_section

TITLE = "Decisions: shared-prefix scoring vs a fresh cache per question"
HYBRID_TITLE = "Decisions on a hybrid model: prefix snapshot vs a fresh cache per question"
VISION_TITLE = "Decisions with images: one vision encoding and prefix per request vs per question"
BATCHED_TITLE = "Decisions: batched suffixes vs one pass per question, from the shared prefix"
VISION_QUESTIONS = 10
AGREEMENT_BOUND = 1e-4


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


def timed_run(model, job: DecisionJob, reuse: bool) -> tuple[float, DecisionRun]:
    start = time.perf_counter()
    run = DecisionRun(model, job, prefix_reuse=reuse)
    run.start()
    while not run.done:
        run.score_next()
    return time.perf_counter() - start, run


def timed(model, job: DecisionJob, reuse: bool) -> tuple[float, object]:
    seconds, run = timed_run(model, job, reuse)
    return seconds, run.result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", type=Path, nargs="?", const=Path(__file__).resolve().parents[2] / "docs"
                        / "benchmarks.md", default=None, help="update this section of docs/benchmarks.md")
    parser.add_argument("--hybrid", action="store_true",
                        help="a tiny random Qwen3.5-style hybrid model: prefix snapshot vs fresh cache")
    parser.add_argument("--batched", action="store_true",
                        help="the shared prefix both ways: all suffixes in batched passes vs one pass per question")
    parser.add_argument("--vision", action="store_true",
                        help="a tiny random Qwen3.5 vision-language model, two images: one vision encoding "
                             "and prefix per request vs per question")
    args = parser.parse_args(argv)
    if args.hybrid + args.vision + args.batched > 1:
        parser.error("--hybrid, --vision and --batched are separate benchmarks: pick one")
    if args.model_dir is None or not (args.model_dir / "config.json").exists():
        parser.error(missing_model_message())
    reexec_with_fast_blas(sys.argv[1:] if argv is None else argv, module="tools.bench.decisions")
    if args.hybrid:
        return hybrid(args)
    if args.vision:
        return vision(args)
    if args.batched:
        return batched(args)
    load = f"{os.getloadavg()[0]:.1f}"
    model = load_language_model("bench", args.model_dir)
    text = ticket(1000, model.tokenizer)
    job = DecisionJob(text, questions(20), 16384)
    timed(model, DecisionJob(text, questions(2), 16384), True)  # warm-up

    s, f, worst, *_ = _compare(model, job, args.runs)
    rows = [("20 questions, shared prefix", f"{s:.2f} s", f"{20 / s:.1f}"),
            ("20 questions, fresh cache each", f"{f:.2f} s", f"{20 / f:.1f}")]
    for n in (1, 10, 50):
        t, _ = timed(model, DecisionJob(text, questions(n), 16384), True)
        rows.append((f"{n} question{'s' if n > 1 else ''}, shared prefix", f"{t:.2f} s", f"{n / t:.1f}"))

    preload = "openblas" in os.environ.get("LD_PRELOAD", "")
    lines = [
        f"Measured {today()} with `python -m tools.bench.decisions --runs {args.runs} --write` "
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


class Comparison(NamedTuple):
    shared: float  # median seconds, shared prefix
    fresh: float  # median seconds, fresh cache per question
    worst: float  # the largest probability difference between the two ways, over every run
    prefix: int  # the shared prefix length, in tokens
    shared_run: DecisionRun  # the last run of each way, for its counters
    fresh_run: DecisionRun


def _compare(model, job: DecisionJob, runs: int) -> Comparison:
    """Both ways `runs` times, alternating: medians, the largest probability difference, the last runs."""
    shared_t, fresh_t, worst = [], [], 0.0
    shared_run = fresh_run = None
    for _ in range(runs):
        t_shared, shared_run = timed_run(model, job, True)
        t_fresh, fresh_run = timed_run(model, job, False)
        shared_t.append(t_shared)
        fresh_t.append(t_fresh)
        for a, b in zip(shared_run.answers, fresh_run.answers, strict=True):
            worst = max(worst, *(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True)))
    return Comparison(statistics.median(shared_t), statistics.median(fresh_t), worst,
                      shared_run.result().shared_prefix_tokens, shared_run, fresh_run)


def hybrid(args: argparse.Namespace) -> int:
    import tempfile

    from tools.testmodels.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_model(args.model_dir, Path(tmp) / "tiny-qwen3_5", arch="qwen3_5")
        model = load_language_model("bench-hybrid", folder)
        text = ticket(1000, model.tokenizer)
        job = DecisionJob(text, questions(20), 16384)
        timed(model, DecisionJob(text, questions(2), 16384), True)  # warm-up
        s, f, worst, prefix, *_ = _compare(model, job, args.runs)
    lines = [
        f"Measured {today()} with `python -m tools.bench.decisions --hybrid --runs {args.runs} --write` "
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


class Steps(NamedTuple):
    start: float  # seconds in start(): preparing the questions and prefilling the shared prefix
    scoring: float  # seconds scoring the questions from the prefix
    run: DecisionRun


def timed_steps(model, job: DecisionJob, batch: bool) -> Steps:
    t0 = time.perf_counter()
    run = DecisionRun(model, job)
    run.start()
    t1 = time.perf_counter()
    if batch:
        run.score_batch()
    else:
        while not run.done:
            run.score_next()
    return Steps(t1 - t0, time.perf_counter() - t1, run)


def batched(args: argparse.Namespace) -> int:
    load = f"{os.getloadavg()[0]:.1f}"
    model = load_language_model("bench", args.model_dir)
    text = ticket(1000, model.tokenizer)
    n = 20
    job = DecisionJob(text, questions(n), 16384)
    warm = DecisionJob(text, questions(2), 16384)
    timed_steps(model, warm, True)  # warm-up, both ways
    timed_steps(model, warm, False)
    ways: dict[bool, list[Steps]] = {True: [], False: []}
    worst = 0.0
    for _ in range(args.runs):
        for batch in (True, False):
            ways[batch].append(timed_steps(model, job, batch))
        for a, b in zip(ways[True][-1].run.answers, ways[False][-1].run.answers, strict=True):
            worst = max(worst, *(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True)))
    if worst > AGREEMENT_BOUND:
        raise SystemExit(f"the two ways disagree: largest probability difference {worst:.1e} "
                         f"(bound: {AGREEMENT_BOUND:.0e})")
    med = {batch: (statistics.median(s.start + s.scoring for s in steps), statistics.median(s.start for s in steps),
                   statistics.median(s.scoring for s in steps)) for batch, steps in ways.items()}
    for batch, steps in ways.items():
        print(("batched" if batch else "one pass per question") + ": "
              + ", ".join(f"start {s.start:.2f} s + scoring {s.scoring:.2f} s" for s in steps))
    run = ways[True][-1].run
    suffixes = [len(q.ids) - run.prefix for q in run.prepared]
    (bt, bp, bs), (ot, op, os_) = med[True], med[False]
    preload = "openblas" in os.environ.get("LD_PRELOAD", "")
    lines = [
        f"Measured {today()} with `python -m tools.bench.decisions --batched --runs {args.runs} --write` "
        f"(median of {args.runs} alternating runs, one process), SmolLM2-135M-Instruct float32, {n} questions "
        f"over a {len(model.tokenizer.encode(text))}-token input: shared prefix {run.prefix} tokens, suffixes "
        f"{min(suffixes)} to {max(suffixes)} tokens; {os.cpu_count()} CPUs, {platform.machine()}, OpenBLAS "
        f"preloaded: {'yes' if preload else 'no'}, load average before the run: {load}. Both ways prefill the "
        f"shared prefix once per request (`start()`); scoring is the time after it. Each column is its own median.", "",
        "| case | total | prefill (start) | scoring | questions/s (total) |", "|---|---:|---:|---:|---:|",
        f"| {n} questions, suffixes in one batched pass | {bt:.2f} s | {bp:.2f} s | {bs:.2f} s | {n / bt:.1f} |",
        f"| {n} questions, one pass per question | {ot:.2f} s | {op:.2f} s | {os_:.2f} s | {n / ot:.1f} |", "",
        f"**Batched suffixes score {os_ / bs:.1f}x faster** than one pass per question ({ot / bt:.1f}x on the "
        f"whole request). Largest probability difference between the two ways: {worst:.1e} (bound: 1e-4).", "",
    ]
    return _publish(BATCHED_TITLE, lines, args.write)


def photos() -> tuple:
    """Two photo-sized RGB images of seeded random noise: 640x480 (landscape) and 480x640 (portrait)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return tuple(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
                 for w, h in ((640, 480), (480, 640)))


def vision(args: argparse.Namespace) -> int:
    import tempfile

    from swama.engine.serving.loaders import load_model
    from tools.testmodels.tiny import build_tiny_model

    images = photos()
    n = VISION_QUESTIONS
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_model(args.model_dir, Path(tmp) / "tiny-qwen3_5_vl", arch="qwen3_5_vl")
        model = load_model("bench-vision", folder)
        text = ticket(1000, model.tokenizer)
        text_tokens = len(model.tokenizer.encode(text))
        job = DecisionJob(text, questions(n), context_limit=16384, images=images)
        timed(model, DecisionJob(text, questions(2), context_limit=16384, images=images), True)  # warm-up
        c = _compare(model, job, args.runs)
    result = c.shared_run.result()
    image_tokens = c.shared_run.prepared[0].processed.image_tokens
    question_tokens = len(c.shared_run.prepared[0].ids)
    encodings = (c.shared_run.vision_encodings, c.fresh_run.vision_encodings)
    if c.worst > AGREEMENT_BOUND:
        raise SystemExit(f"the two ways disagree: largest probability difference {c.worst:.1e} "
                         f"(bound: {AGREEMENT_BOUND:.0e})")
    if encodings != (1, n):
        raise SystemExit(f"expected 1 vision encoding with the shared prefix and {n} without, got {encodings}")
    print(f"image tokens {image_tokens} (two images), input tokens {result.input_tokens} over {n} questions "
          f"({question_tokens} for the first), shared prefix {result.shared_prefix_tokens} tokens")
    sizes = " and ".join(f"{i.width}x{i.height}" for i in images)
    lines = [
        f"Measured {today()} with `python -m tools.bench.decisions --vision --runs {args.runs} --write` "
        f"(median of {args.runs} alternating runs, one process): a tiny random-weight Qwen3.5 "
        f"vision-language model (the hybrid text stack above plus a 2-layer vision tower, one image token "
        f"per 32x32 pixels), {n} questions over two random-noise photos ({sizes}, {image_tokens} image "
        f"tokens together) and a {text_tokens}-token text input: {question_tokens} tokens for the first "
        f"question, {result.input_tokens} over all {n}, shared prefix {result.shared_prefix_tokens} tokens; "
        f"{os.cpu_count()} CPUs, {platform.machine()}. Both ways run the processor (resize, normalize) once "
        f"per question; the difference is the vision tower and the prefill.", "",
        "| case | time | questions/s | vision encodings |", "|---|---:|---:|---:|",
        f"| {n} questions, one vision encoding and prefix per request | {c.shared:.3f} s | {n / c.shared:.1f} "
        f"| {encodings[0]} |",
        f"| {n} questions, vision encoding and prefill per question | {c.fresh:.3f} s | {n / c.fresh:.1f} "
        f"| {encodings[1]} |", "",
        f"**One encoding and prefix per request is {c.fresh / c.shared:.1f}x faster** than encoding the "
        f"images and prefilling from scratch for every question. Largest probability difference between the two ways: {c.worst:.1e} "
        f"(bound: 1e-4).", "",
    ]
    return _publish(VISION_TITLE, lines, args.write)


if __name__ == "__main__":
    raise SystemExit(main())
