"""Structured outputs in the engine: the mask, the grammar cache, and constrained rows in the batch.

A constrained row must not change what a free row beside it generates; its grammar state belongs to
its row, so a cancelled row or a prompt resumed from the prompt cache leaves the next request's
grammar whole. On the real SmolLM2 (the tiny random model runs every schema on the live server).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import jsonschema
import mlx.core as mx
import pytest

from swama.engine.errors import BadInput
from swama.engine.model import LoadedModel
from swama.engine.serving.scheduler import Scheduler
from swama.engine.text.generator import (
    ChatRequest,
    Finished,
    Logprobs,
    Sampling,
    TextDelta,
    ToolCallEvent,
    generate,
)
from swama.engine.text.grammar import CompileBudget, Constraint, ToolSpec, grammars
from swama.engine.text.language import load_language_model
from swama.engine.text.prompt_cache import PromptCache

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0,
                                                                             "maximum": 120}}}


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> LoadedModel:
    return load_language_model("smollm2", smollm2_dir)


def _request(prompt: str, constraint: Constraint | None = None, max_tokens: int = 64, **extra: Any) -> ChatRequest:
    return ChatRequest([{"role": "user", "content": prompt}], sampling=Sampling(temperature=0), max_tokens=max_tokens,
                       context_limit=2048, constraint=constraint, **extra)


async def _collect(scheduler: Scheduler, request: ChatRequest) -> tuple[str, Finished, list[Any]]:
    text, finished, other = "", None, []
    async for event in scheduler.generate(request):
        if isinstance(event, TextDelta):
            text += event.text
        elif isinstance(event, Finished):
            finished = event
        else:
            other.append(event)
    assert finished is not None
    return text, finished, other


def _run(model: LoadedModel, requests: list[ChatRequest], cache: PromptCache | None = None) -> list[Any]:
    async def run() -> list[Any]:
        scheduler = Scheduler(model, prompt_cache=cache, rows=8, prefill_step=64)
        try:
            return await asyncio.gather(*(_collect(scheduler, r) for r in requests))
        finally:
            scheduler.close()

    return asyncio.run(run())


def test_free_rows_are_unchanged_by_constrained_rows_beside_them(smollm2: LoadedModel) -> None:
    free = _request("Write a haiku about rivers.", max_tokens=32)
    alone = _run(smollm2, [free])[0]
    schema = Constraint("json_schema", json.dumps(PERSON))
    mixed = _run(smollm2, [_request("Describe a person.", schema), free, _request("JSON please.",
                                                                                   Constraint("json_object"))])
    assert mixed[1][1].token_ids == alone[1].token_ids
    value = json.loads(mixed[0][0])
    jsonschema.validate(value, PERSON)
    assert isinstance(json.loads(mixed[2][0]), dict) or mixed[2][1].finish_reason == "length"


def test_alone_path_enforces_the_same_grammar(smollm2: LoadedModel) -> None:
    """Requests served without batching (vision models, --no-batching) take generate(): same mask."""
    request = _request("Describe a person.", Constraint("json_schema", json.dumps(PERSON)))
    events = list(generate(smollm2, request, threading.Event()))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert events[-1].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    batched = _run(smollm2, [request])[0]
    assert batched[1].token_ids == events[-1].token_ids


def test_the_mask_allows_exactly_the_grammar_s_tokens(smollm2: LoadedModel) -> None:
    from llguidance import LLMatcher

    constraint = Constraint("json_schema", json.dumps(PERSON))
    g = grammars(smollm2)
    processor = g.matcher(constraint, ("", ""))
    reference = LLMatcher(g.ll, g.compile(constraint, ("", "")), log_level=0)
    from swama.engine.text.grammar import Enforcer

    enforcer = Enforcer(processor, g.width, g.eos)
    logits = mx.zeros((1, g.width))
    prompt = mx.array([1, 2, 3])
    for token in smollm2.tokenizer.encode('{"name": "Ada", "age": 36}', add_special_tokens=False):
        masked = enforcer(prompt, logits)
        allowed = _finite(masked)
        bits = reference.compute_bitmask()
        expected = {i for i in range(g.width) if bits[i // 8] >> (i % 8) & 1}
        assert allowed == expected and token in allowed
        reference.consume_token(token)
        prompt = mx.concatenate([prompt, mx.array([token])])
    assert g.eos in _finite(enforcer(prompt, logits))  # the document is whole: it may end


def _finite(masked: mx.array) -> set[int]:
    return {i for i, ok in enumerate(mx.isfinite(masked[0]).tolist()) if ok}


def test_a_grammar_compiles_once_per_schema(smollm2: LoadedModel) -> None:
    g = grammars(smollm2)
    constraint = Constraint("json_schema", json.dumps({"type": "object", "properties": {"q": {"type": "integer"}}}))
    first = g.compile(constraint, ("", ""))
    assert g.compile(Constraint("json_schema", constraint.schema), ("", "")) is first


def test_a_compile_past_its_budget_is_refused_and_the_pool_goes_on(smollm2: LoadedModel) -> None:
    """A string property holding 15 letters each (an allOf of `.*a.*`, `.*b.*`, ...): llguidance's
    emptiness check of the patterns' intersection takes about 2.5 s on this project's CPU and doubles
    with each letter (20 ran for minutes). Past a 0.2 s budget the request is refused, naming the
    setting; the compile runs out in the grammar pool, which then takes the next one."""
    g = grammars(smollm2)
    budget = g.budget
    letters = {"type": "string", "allOf": [{"pattern": f".*{chr(97 + i)}.*"} for i in range(15)]}
    slow = Constraint("json_schema", json.dumps({"type": "object", "properties": {"v": letters}}))
    try:
        g.budget = CompileBudget(0.2)
        with pytest.raises(BadInput, match=r"did not compile within 0.2 s \(--grammar-compile-seconds\)") as refused:
            g.matcher(slow, ("", ""))
        assert refused.value.code == "schema_too_complex"
    finally:
        g.budget = budget
    plain = Constraint("json_schema", json.dumps({"type": "object", "properties": {"b": {"type": "boolean"}}}))
    assert g.matcher(plain, ("", "")) is not None


def test_unenforceable_schemas_are_refused_by_keyword(smollm2: LoadedModel) -> None:
    for schema, word in [({"type": "array", "uniqueItems": True}, "uniqueItems"),
                         ({"if": {"type": "string"}, "then": {"minLength": 2}}, "if, then"),
                         ({"type": "string", "format": "zipcode"}, "zipcode"),
                         ({"$ref": "https://example.com/x.json"}, "cannot be enforced")]:
        with pytest.raises(BadInput, match=word):
            list(generate(smollm2, _request("x", Constraint("json_schema", json.dumps(schema))), threading.Event()))


def test_grammar_state_survives_the_prompt_cache_and_cancellation(smollm2: LoadedModel) -> None:
    cache = PromptCache(1 << 30)
    constraint = Constraint("json_schema", json.dumps(PERSON))

    async def run() -> list[Any]:
        scheduler = Scheduler(smollm2, prompt_cache=cache, rows=8, prefill_step=64)
        try:
            # A constrained request cancelled after a few tokens...
            events = scheduler.generate(_request("Describe a person.", constraint))
            async for event in events:
                if isinstance(event, TextDelta):
                    break
            await events.aclose()
            await asyncio.sleep(1.0)  # the row leaves at the next turn, its cache going to the prompt cache
            # ...then the same prompt again (resumed from the prompt cache) and a fresh one.
            return await asyncio.gather(_collect(scheduler, _request("Describe a person.", constraint)),
                                        _collect(scheduler, _request("Describe someone else.", constraint)))
        finally:
            scheduler.close()

    results = asyncio.run(run())
    for text, finished, _ in results:
        assert finished.finish_reason == "stop"
        jsonschema.validate(json.loads(text), PERSON)
    assert results[0][1].cached_tokens > 0  # the repeated prompt was resumed from the cache


def test_forced_tool_call_in_the_model_s_format(smollm2: LoadedModel) -> None:
    params = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "maxLength": 20}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                               "parameters": params}}]
    constraint = Constraint("tool_calls", tools=(ToolSpec("get_weather", json.dumps(params), True),), parallel=False)
    text, finished, other = _run(smollm2, [_request("Weather in Paris?", constraint, tools=tools,
                                                    parallel_tool_calls=False, logprobs=2)])[0]
    calls = [e.call for e in other if isinstance(e, ToolCallEvent)]
    assert finished.finish_reason == "tool_calls" and len(calls) == 1 and text == ""
    jsonschema.validate(json.loads(calls[0].arguments), params)
    entries = [x for e in other if isinstance(e, Logprobs) for x in e.entries]
    assert len(entries) == finished.completion_tokens and all(len(x.top) == 2 for x in entries)
