"""Structured outputs inside the batch scheduler: constrained rows against free rows, and the two
grammar engines side by side, on SmolLM2.

    python -m tools.bench.structured [--model-dir DIR] [--rows 1 8 16] [--tokens 128] [--repeats 3]

For each row count, each kind of batch decodes `--tokens` tokens a row (every row runs to its
budget, so each kind takes the same number of steps):
- free: unconstrained prompts;
- llguidance: every row held to a JSON schema by swama's own mask (engine/text/grammar.py);
- xgrammar: the same rows with xgrammar's matcher in the same place (only when xgrammar is
  installed: `pip install xgrammar`; it is not a dependency of swama).
Reported: decode tokens per second over all rows (median of `--repeats` runs, with the spread),
the constrained rate as a share of the free one, the host time the mask takes per step (filling the
bitmask and advancing the matcher, per row), and the time to compile the large schema of
tools/bench/grammar.py cold (llguidance: grammar text plus the first matcher; xgrammar: its compile).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench.common import default_model_dir, missing_model_message
from tools.bench.grammar import SCHEMA

# Each row's output runs to its budget: an array of at least 200 strings never completes first.
LONG = {"type": "object", "additionalProperties": False, "required": ["lines"],
        "properties": {"lines": {"type": "array", "minItems": 200, "items": {"type": "string", "maxLength": 60}}}}
PROMPTS = ["Write a long story about a lighthouse keeper.", "Describe the history of Rome in detail.",
           "Explain how a steam engine works, step by step.", "Write a long poem about the sea."]


class Timed:
    """Wraps a row's mask to add up the host time it spends: advancing its matcher, filling and
    unpacking its bitmask (the wait for the token sampled last, which the step needs anyway, is
    taken before the clock starts)."""

    total = 0.0
    calls = 0

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        mx.async_eval(logits)  # as the masks themselves do: the forward pass starts first
        tokens[-1].item()
        start = time.perf_counter()
        out = self.inner(tokens, logits)
        Timed.total += time.perf_counter() - start
        Timed.calls += 1
        return out


class XgrammarMask:
    """xgrammar's matcher in the place of swama's llguidance one (same per-row processor contract)."""

    def __init__(self, compiled: Any, width: int, eos: int) -> None:
        import numpy as np
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.mask = xgr.allocate_token_bitmask(1, width)
        self.width, self.eos, self.np = width, eos, np
        self.started = False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        if self.started:
            mx.async_eval(logits)
            self.matcher.accept_token(int(tokens[-1].item()))
        self.started = True
        self.matcher.fill_next_token_bitmask(self.mask, 0)
        words = self.mask.numpy().view(self.np.uint8)
        allowed = self.np.unpackbits(words, bitorder="little")[: self.width].astype(self.np.bool_)
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))


def _requests(kind: str, rows: int, tokens: int) -> list[Any]:
    from swama.engine.text.generator import ChatRequest, Sampling
    from swama.engine.text.grammar import Constraint

    constraint = None if kind == "free" else Constraint("json_schema", json.dumps(LONG))
    return [ChatRequest([{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + " Answer in JSON."}],
                        sampling=Sampling(temperature=0.8, seed=i), max_tokens=tokens, context_limit=4096,
                        constraint=constraint) for i in range(rows)]


def _decode_rate(model: Any, requests: list[Any]) -> tuple[float, int]:
    """Decode tokens per second over all rows, from the first token of any row to the last row's end
    (a second prefill batch, past 8 rows, falls inside that window for every kind alike)."""
    from swama.engine.serving.scheduler import Scheduler
    from swama.engine.text.generator import Finished

    async def run() -> tuple[float, int]:
        scheduler = Scheduler(model, prompt_cache=None, rows=max(len(requests), 1), prefill_step=512)
        firsts: list[float] = []
        ends: list[float] = []
        total = 0

        async def one(request: Any) -> None:
            nonlocal total
            first = None
            async for event in scheduler.generate(request):
                first = first or time.perf_counter()
                if isinstance(event, Finished):
                    total += event.completion_tokens
                    ends.append(time.perf_counter())
            firsts.append(first)

        try:
            await asyncio.gather(*(one(r) for r in requests))
        finally:
            scheduler.close()
        return total / (max(ends) - min(firsts)), total

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.model_dir is None:
        print(missing_model_message(), file=sys.stderr)
        return 2
    import swama.engine.text.generator as generator
    from swama.engine.text.grammar import enforcer, grammars
    from swama.engine.text.language import load_language_model

    model = load_language_model("smollm2", args.model_dir)
    g = grammars(model)
    engines: dict[str, Any] = {"llguidance": lambda m, c, f: Timed(enforcer(m, c, f))}
    try:
        import xgrammar as xgr
        from transformers import AutoTokenizer

        info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(str(args.model_dir)),
                                                  vocab_size=g.width)
        compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(LONG))
        engines["xgrammar"] = lambda m, c, f: Timed(XgrammarMask(compiled, g.width, g.eos))
    except ImportError:
        print("xgrammar is not installed: its rows are left out", file=sys.stderr)

    _decode_rate(model, _requests("free", 2, 8))  # warm-up: compile paths, buffers
    print(f"SmolLM2, {args.tokens} tokens a row, median of {args.repeats} runs (min-max)\n")
    print("| rows | kind | decode tok/s | tokens generated | share of free | mask host ms / row-step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rows in args.rows:
        runs = [_decode_rate(model, _requests("free", rows, args.tokens)) for _ in range(args.repeats)]
        free = [r for r, _ in runs]
        base = statistics.median(free)
        print(f"| {rows} | free | {base:.1f} ({min(free):.1f}-{max(free):.1f}) | "
              f"{statistics.median(n for _, n in runs)} | 100% | - |", flush=True)
        for name, make in engines.items():
            generator.enforcer = make  # the scheduler builds each row's mask through this name
            Timed.total, Timed.calls = 0.0, 0
            runs = [_decode_rate(model, _requests(name, rows, args.tokens)) for _ in range(args.repeats)]
            generator.enforcer = enforcer
            rates = [r for r, _ in runs]
            rate = statistics.median(rates)
            print(f"| {rows} | {name} | {rate:.1f} ({min(rates):.1f}-{max(rates):.1f}) | "
                  f"{statistics.median(n for _, n in runs)} | {rate / base:.0%} | "
                  f"{Timed.total / max(Timed.calls, 1) * 1e3:.3f} |", flush=True)

    from llguidance import LLMatcher

    start = time.perf_counter()
    grammar = LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    LLMatcher(g.ll, grammar, log_level=0).compute_bitmask()
    cold = time.perf_counter() - start
    line = f"\nLarge schema, cold: llguidance {cold * 1e3:.1f} ms (grammar, matcher and its first mask)"
    if "xgrammar" in engines:
        start = time.perf_counter()
        xgr.GrammarCompiler(info, cache_enabled=False).compile_json_schema(json.dumps(SCHEMA))
        line += f"; xgrammar {(time.perf_counter() - start) * 1e3:.1f} ms (its compile)"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
