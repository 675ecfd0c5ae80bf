"""Where one decision request's time goes, stage by stage.

    python -m tools.bench.decision_stages [--model-dir DIR] [--questions 20] [--runs 5]
                                                [--write [docs/benchmarks.md]]

Runs the steps of `DecisionRun.start()` and `score_batch()` one by one on 20 questions over a
~1,000-token input (every request with its own first line, so nothing is reused across requests but
the label checks kept per tokenizer), each stage ended by a sync so it is timed alone:

- render: the chat template, once per question;
- encode: the prompts (the shared input once) and the round-trip check;
- checks and labels: context, reasoning and label checks, the label token ids;
- prefix: the shared prefix prefilled into a KV cache (no logits);
- tile: the prefix keys and values copied into one row per question;
- suffixes: the suffixes' forward pass through the transformer body;
- head: the vocabulary projection at each row's last real token, read back to the host;
- answers: log-probabilities and answers from the label logits.

The syncs between stages cost a little, so the stages add up to slightly more than a request.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from tools.bench.common import add_write_option, default_model_dir, machine_facts, publish, today

TITLE = "Decisions: where one request's time goes"
STAGES = ("render", "encode", "checks and labels", "prefix", "tile", "suffixes", "head", "answers")


def one_request(model, job) -> dict[str, float]:
    import mlx.core as mx

    from swama.engine.decisions import decide
    from swama.engine.decisions.heads import fill_cache
    from swama.engine.decisions.next_token import reduce_rows
    from swama.engine.decisions.scorer import (
        answer_from_logprobs,
        build_content,
        check_context,
        check_reasoning_closed,
        labels_for,
        logprobs_from_reduction,
    )
    from swama.engine.decisions.scorer.batch_encode import encode_prompts, round_trips
    from swama.engine.kinds.vision import network

    times: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        times[name] = now - clock
        clock = now

    state = decide.decision_state(model)
    tok = state.label_tokenizer
    views = list(job.questions)
    labels = [labels_for(v, lambda: state.pair_labels) for v in views]
    contents = [build_content(job.text, v, lab) for v, lab in zip(views, labels, strict=True)]
    prompts = [decide._render(model, c) for c in contents]
    lap("render")
    encoded = encode_prompts(tok, prompts)
    ok = round_trips(tok, prompts, encoded)
    lap("encode")
    memo = state.label_memo
    label_ids = []
    for ids, prompt, content, lab, good in zip(encoded.ids, prompts, contents, labels, ok, strict=True):
        check_context(len(ids), job.context_limit)
        assert good
        check_reasoning_closed(prompt, content)
        label_ids.append(decide.label_token_ids(tok, prompt, ids, lab, memo))
    lap("checks and labels")
    net = network(model)
    prefix = decide.common_prefix(encoded.ids)
    from mlx_lm.models.cache import make_prompt_cache

    shared = make_prompt_cache(net)
    fill_cache(net, mx.array(encoded.ids[0][:prefix])[None], shared)
    lap("prefix")
    suffixes = [ids[prefix:] for ids in encoded.ids]
    width = max(map(len, suffixes))
    cache = decide.tiled_cache(shared, len(suffixes), width)
    mx.eval([c.state for c in cache])
    lap("tile")
    split = state.head_split
    tokens = mx.array([s + [0] * (width - len(s)) for s in suffixes])
    body, head = split
    hidden = body(tokens, cache=cache)
    mx.eval(hidden)
    lap("suffixes")
    rows, cols = mx.arange(len(suffixes)), mx.array([len(s) - 1 for s in suffixes])
    logits = head(hidden[rows, cols]).astype(mx.float32)
    mx.eval(logits)
    lap("head")
    reduced = reduce_rows(logits, label_ids, state.opener_ids)
    lap("reduce on the device")
    for q, row in zip(views, reduced, strict=True):
        answer_from_logprobs(q.kind, logprobs_from_reduction(row.top, row.total, row.labels))
    lap("answers")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    add_write_option(parser)
    args = parser.parse_args(argv)
    from swama.engine.decisions.decide import DecisionJob, DecisionRun
    from swama.engine.kinds.vision import vision_of
    from swama.engine.runtime import compute_dtype, on_gpu, reexec_with_fast_blas
    from swama.engine.text.language import load_language_model
    from tools.bench.decisions import questions, ticket

    reexec_with_fast_blas(sys.argv[1:] if argv is None else argv, module="tools.bench.decision_stages")
    model = load_language_model("bench", args.model_dir)
    if vision_of(model) is not None or DecisionRun(model, DecisionJob("x", [], 1)).split is None:
        parser.error("the stages are those of a text model whose vocabulary projection splits off")
    text = ticket(1000, model.tokenizer)
    laps: dict[str, list[float]] = {s: [] for s in STAGES}
    whole: list[float] = []
    for i in range(args.runs + 1):  # the first is a warm-up
        job = DecisionJob(f"Request {i}.\n{text}", questions(args.questions), 16384)
        t = one_request(model, job)
        started = time.perf_counter()
        run = DecisionRun(model, DecisionJob(f"Request {i} again.\n{text}", questions(args.questions), 16384))
        run.start()
        run.score_batch()
        if i:
            whole.append(time.perf_counter() - started)
            for s in STAGES:
                laps[s].append(t[s])
    med = {s: statistics.median(v) * 1000 for s, v in laps.items()}
    total = sum(med.values())
    request = statistics.median(whole) * 1000
    rows = "\n".join(f"| {s} | {med[s]:.1f} | {med[s] / total:.0%} |" for s in STAGES)
    facts = machine_facts()
    body = (
        f"Measured {today()} with `python -m tools.bench.decision_stages --runs {args.runs} --write` on "
        f"{args.model_dir.name} ({str(compute_dtype()).removeprefix('mlx.core.')} on the "
        f"{'GPU' if on_gpu() else 'CPU'}; {facts.get('cpu', facts.get('processor', ''))}): {args.questions} "
        f"questions over a ~1,000-token input, median of {args.runs} requests, each with its own input.\n\n"
        "| stage | ms | share |\n|---|---:|---:|\n" + rows + "\n\n"
        f"Stages summed: {total:.1f} ms; a whole request (`DecisionRun.start()` + `score_batch()`, no syncs "
        f"between stages): {request:.1f} ms, **{args.questions / request * 1000:.0f} questions/s**.\n"
    )
    publish(TITLE + (" (GPU)" if on_gpu() else " (CPU)"), body, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
