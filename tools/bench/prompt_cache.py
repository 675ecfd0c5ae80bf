"""Prompt cache: prefill work of a 10-turn conversation with the cache and without, in one run.

    python -m tools.bench.prompt_cache [--model-dir DIR] [--turns N] [--write docs/benchmarks.md]

The same greedy conversation (SmolLM2 from the test cache by default, float32) runs twice on one
loaded model: once with a fresh prompt cache, once with none. It reports the prompt tokens
prefilled and the prefill seconds summed over the turns, and checks both runs said the same.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from swama.engine.runtime import reexec_with_fast_blas
from swama.engine.serving.loaders import load_model
from swama.engine.text.generator import ChatRequest, Finished, Sampling, TextDelta, generate
from swama.engine.text.prompt_cache import PromptCache
from tools.bench.common import (
    add_write_option,
    default_model_dir,
    markdown_table,
    missing_model_message,
    publish,
    today,
)

TITLE = "Prompt cache: a 10-turn conversation with and without it"
QUESTIONS = ["What is the capital of France?", "And of Germany?", "Which one is larger?", "Name a river there.",
             "How long is it?", "Name a famous bridge.", "When was it built?", "Who designed it?",
             "Name another one.", "Thanks, summarise what we said."]


def conversation(model, turns: int, cached: bool) -> tuple[list[str], int, int, float]:
    model.beside.set(PromptCache, None)
    if cached:
        model.beside.set(PromptCache, PromptCache(1 << 30))
    messages, replies, prompt, prefilled, seconds = [], [], 0, 0, 0.0
    for question in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": question})
        request = ChatRequest(messages=list(messages), sampling=Sampling(temperature=0.0), max_tokens=24,
                              context_limit=8192)
        text = []
        for event in generate(model, request, threading.Event()):
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, Finished):
                prompt += event.prompt_tokens
                prefilled += event.prompt_tokens - event.cached_tokens
                seconds += event.prompt_seconds
        replies.append("".join(text))
        messages.append({"role": "assistant", "content": replies[-1]})
    model.beside.set(PromptCache, None)
    return replies, prompt, prefilled, seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--turns", type=int, default=10)
    add_write_option(parser)
    args = parser.parse_args(argv)
    reexec_with_fast_blas(sys.argv[1:] if argv is None else argv, module="tools.bench.prompt_cache")
    model_dir = args.model_dir or default_model_dir()
    if model_dir is None:
        sys.exit(missing_model_message())
    model = load_model("bench", model_dir)
    conversation(model, 1, False)  # warm-up
    without = conversation(model, args.turns, False)
    with_cache = conversation(model, args.turns, True)
    same = with_cache[0] == without[0]
    rows = [["without the cache", str(without[1]), str(without[2]), f"{without[3]:.2f}"],
            ["with the cache", str(with_cache[1]), str(with_cache[2]), f"{with_cache[3]:.2f}"]]
    table = markdown_table(["run", "prompt tokens", "tokens prefilled", "prefill s"], rows)
    body = (f"Measured {today()} with `python -m tools.bench.prompt_cache`: {args.turns} greedy turns of "
            f"at most 24 tokens on SmolLM2 (float32), one loaded model. The cache cuts the tokens prefilled to "
            f"{with_cache[2] / without[2]:.0%} and the prefill time to {with_cache[3] / without[3]:.0%}; "
            f"both runs gave {'the same' if same else 'DIFFERENT'} replies.\n\n{table}")
    publish(TITLE, body, args.write)


if __name__ == "__main__":
    main()
