"""Prompt lookup's draft length and n-gram sizes, measured in the batch scheduler itself.

The code-edit workload of tools/bench/speculative.py (a 167-line module returned with one change) on
one model, in this process (no HTTP), at temperature 0: for each setting, tok/s of the decode (the
prefill is done once per request before the clock starts, from the prompt cache), the acceptance
(accepted / drafted) and the tokens per decode step, at 1 and 8 rows, `--speculative ngram` so that
every draft found is verified. Prints a markdown table.

    python -m tools.bench.draft_tuning --model-dir .cache/test-models/smollm2-mlx
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench.speculative import code_edit_messages

SETTINGS = [(4, (2, 4)), (8, (2, 4)), (12, (2, 4)), (8, (3, 5)), (8, (1, 3))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path(".cache/test-models/smollm2-mlx"))
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    from swama.engine.serving.scheduler import Scheduler
    from swama.engine.speculative.policy import Speculation
    from swama.engine.text.generator import ChatRequest, Finished, Sampling
    from swama.engine.text.language import load_language_model
    from swama.engine.text.prompt_cache import PromptCache

    model = load_language_model("model", args.model_dir)

    def request(i: int) -> ChatRequest:
        return ChatRequest(code_edit_messages(i), sampling=Sampling(temperature=0), max_tokens=args.max_tokens,
                           context_limit=8192)

    async def finish(scheduler: Scheduler, r: ChatRequest) -> Finished:
        async for event in scheduler.generate(r):
            if isinstance(event, Finished):
                return event
        raise RuntimeError("no Finished event")

    def run(speculation: Any, rows: int) -> tuple[float, float, float]:
        async def go() -> tuple[float, float, float]:
            cache = PromptCache(4 << 30)
            scheduler = Scheduler(model, prompt_cache=cache, rows=rows, prefill_step=512, speculation=speculation)
            try:
                warm = [ChatRequest(request(i).messages, sampling=Sampling(temperature=0), max_tokens=1,
                                    context_limit=8192) for i in range(rows)]
                await asyncio.gather(*(finish(scheduler, r) for r in warm))  # prefills into the prompt cache
                counters = getattr(scheduler._gen, "counters", None)
                before = (counters.drafted, counters.accepted, counters.steps + counters.plain_steps) if counters else (0, 0, 0)
                started = time.perf_counter()
                done = await asyncio.gather(*(finish(scheduler, request(i)) for i in range(rows)))
                seconds = time.perf_counter() - started
                tokens = sum(f.completion_tokens for f in done)
                if counters is None:
                    return tokens / seconds, 0.0, 1.0
                drafted, accepted = counters.drafted - before[0], counters.accepted - before[1]
                steps = counters.steps + counters.plain_steps - before[2]
                return tokens / seconds, accepted / drafted if drafted else 0.0, tokens / rows / max(steps, 1)
            finally:
                scheduler.close()

        return asyncio.run(go())

    print("| rows | drafting | n-gram sizes | max draft | tok/s (median) | spread | acceptance | tokens per row-step |")
    print("|---|---|---|---|---|---|---|---|")
    for rows in args.rows:
        cases = [Speculation("off")] + [Speculation("ngram", k, ngram=n) for k, n in SETTINGS]
        for speculation in cases:
            results = [run(speculation, rows) for _ in range(args.rounds)]
            rates = [r[0] for r in results]
            k = "" if speculation.mode == "off" else str(speculation.max_draft)
            sizes = "" if speculation.mode == "off" else f"{speculation.ngram[0]}-{speculation.ngram[1]}"
            print(f"| {rows} | {speculation.mode} | {sizes} | {k} | {statistics.median(rates):.1f} | "
                  f"{min(rates):.1f}-{max(rates):.1f} | {results[-1][1]:.2f} | {results[-1][2]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
