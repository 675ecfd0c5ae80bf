"""Grammar engines for structured outputs, side by side: llguidance and xgrammar on a real tokenizer.

    python -m tools.bench.grammar [--model-dir DIR] [--steps 5]

For each engine: the time to prepare the tokenizer, the time to compile a large JSON schema (nested
objects, arrays with bounds, enums, anyOf, $ref/$defs, patterns, number bounds), and the host time
per decode step to fill the next-token masks of 1 and of 16 rows and advance each row by its token,
walking the tokens of a valid document. Separately: the time to apply a 16-row mask to float32
logits in MLX (the part that runs on the device, the same for both engines). Medians of `--steps`
repeats of each walk (the median step, and the mean, which counts the rare slow steps).

Neither engine is a dependency of swama yet: `pip install llguidance xgrammar` first. llguidance
compiles lazily, as the matcher advances, so its compile column is the matcher's creation and the
rest of its compile work falls into the steps; xgrammar compiles the whole schema up front.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA: dict[str, Any] = {
    "$defs": {
        "address": {"type": "object", "additionalProperties": False, "required": ["street", "city", "country"],
                    "properties": {"street": {"type": "string", "maxLength": 80},
                                   "city": {"type": "string"},
                                   "postcode": {"type": "string", "pattern": "^[0-9]{5}$"},
                                   "country": {"enum": ["FR", "DE", "US", "JP"]}}},
        "item": {"type": "object", "additionalProperties": False, "required": ["sku", "quantity", "price"],
                 "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                                "price": {"type": "number", "minimum": 0},
                                "gift": {"type": "boolean"},
                                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
    },
    "type": "object", "additionalProperties": False,
    "required": ["order_id", "customer", "items", "status"],
    "properties": {
        "order_id": {"type": "string"},
        "customer": {"type": "object", "additionalProperties": False, "required": ["name", "email", "address"],
                     "properties": {"name": {"type": "string"}, "email": {"type": "string"},
                                    "address": {"$ref": "#/$defs/address"},
                                    "billing": {"$ref": "#/$defs/address"}}},
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 20},
        "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
        "priority": {"type": "integer", "minimum": 0, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    },
}
DOCUMENT = {
    "order_id": "A-1029",
    "customer": {"name": "Ada Lovelace", "email": "ada@example.org",
                 "address": {"street": "12 Rue de la Paix", "city": "Paris", "postcode": "75002", "country": "FR"}},
    "items": [{"sku": "ABC-1234", "quantity": 2, "price": 19.5, "gift": False, "note": None},
              {"sku": "XYZ-0001", "quantity": 1, "price": 5, "note": "wrap it"}],
    "status": "paid", "priority": 3, "tags": ["web", "repeat"],
}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def llguidance_engine(hf: Any, vocab: int) -> dict[str, Any]:
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lnp

    setup, tokenizer = timed(lambda: llguidance.hf.from_tokenizer(hf, n_vocab=vocab))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    compile_s, _ = timed(lambda: llguidance.LLMatcher(tokenizer, grammar))

    def walk(rows: int, tokens: list[int]) -> list[float]:
        matchers = [llguidance.LLMatcher(tokenizer, grammar) for _ in range(rows)]
        mask = lnp.allocate_token_bitmask(rows, tokenizer.vocab_size)
        steps = []
        for token in tokens:
            start = time.perf_counter()
            for i, m in enumerate(matchers):
                lnp.fill_next_token_bitmask(m, mask, i)
                m.consume_token(token)
            steps.append(time.perf_counter() - start)
        assert all(not m.is_error() for m in matchers), matchers[0].get_error()
        return steps

    return {"setup": setup, "compile": compile_s, "walk": walk, "version": llguidance.get_version()}


def xgrammar_engine(hf: Any, vocab: int) -> dict[str, Any]:
    import importlib.metadata

    import xgrammar as xgr

    setup, info = timed(lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    compile_s, compiled = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA)))

    def walk(rows: int, tokens: list[int]) -> list[float]:
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
        mask = xgr.allocate_token_bitmask(rows, info.vocab_size)
        steps = []
        for token in tokens:
            start = time.perf_counter()
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(mask, i)
                assert m.accept_token(token)
            steps.append(time.perf_counter() - start)
        return steps

    return {"setup": setup, "compile": compile_s, "walk": walk, "version": importlib.metadata.version("xgrammar")}


def mlx_mask_apply(rows: int, vocab: int, repeats: int) -> float:
    """Median seconds to turn an int32 bitmask [rows, vocab/32] into -inf on float32 logits, in MLX."""
    import mlx.core as mx
    import numpy as np

    words = (vocab + 31) // 32
    bitmask = np.random.default_rng(0).integers(-2**31, 2**31 - 1, (rows, words), dtype=np.int64).astype(np.int32)
    logits = mx.random.normal((rows, vocab))
    shifts = mx.arange(32, dtype=mx.uint32)
    mx.eval(logits, shifts)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        bits = (mx.array(bitmask).view(mx.uint32)[:, :, None] >> shifts) & 1
        allowed = bits.reshape(rows, words * 32)[:, :vocab].astype(mx.bool_)
        mx.eval(mx.where(allowed, logits, -mx.inf))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=Path(".cache/test-models/smollm2-mlx"))
    parser.add_argument("--steps", type=int, default=5, help="repeats of each walk; the median is reported")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(args.model_dir))
    vocab = int(json.loads((args.model_dir / "config.json").read_text())["vocab_size"])
    tokens = hf.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    print(f"tokenizer of {args.model_dir.name} (vocabulary {vocab}); the document: {len(tokens)} tokens\n")
    print("| engine | tokenizer setup ms | schema compile ms | step, 1 row, ms (median / mean) | "
          "step, 16 rows, ms (median / mean) |")
    print("| --- | --- | --- | --- | --- |")
    for name, make in (("llguidance", llguidance_engine), ("xgrammar", xgrammar_engine)):
        engine = make(hf, vocab)
        cells = []
        for rows in (1, 16):
            walks = [engine["walk"](rows, tokens) for _ in range(args.steps)]
            median = statistics.median(statistics.median(w) for w in walks)
            mean = statistics.median(statistics.fmean(w) for w in walks)
            cells.append(f"{median * 1e3:.3f} / {mean * 1e3:.3f}")
        print(f"| {name} {engine['version']} | {engine['setup'] * 1e3:.0f} | {engine['compile'] * 1e3:.1f} | "
              f"{cells[0]} | {cells[1]} |", flush=True)
    print(f"\nApplying a 16-row mask to float32 logits in MLX: {mlx_mask_apply(16, vocab, 20) * 1e3:.2f} ms a step "
          f"(1 row: {mlx_mask_apply(1, vocab, 20) * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
