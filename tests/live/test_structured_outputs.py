"""Structured outputs on a live server, through the openai SDK: JSON schemas, JSON mode and forced or
strict tool calls, batched with unconstrained requests in the same steps.

Every output that ends with finish_reason "stop" must parse and validate (jsonschema, with format
checks); a "length" cut is reported as such. Both SmolLM2 (real weights) and the tiny random Qwen3
run every schema: random weights are the harshest test of a mask, since nothing but the grammar
keeps them on track.
"""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import jsonschema
import openai
import pytest
from structured_schemas import SCHEMAS

from live_server import LiveServer

pytestmark = pytest.mark.slow

SMOL, TINY = "smollm2", "test/tiny-qwen3"
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
FREE_PROMPTS = ["Write a haiku about rivers.", "Tell me a joke.", "What is rain?", "Count to five."]


@pytest.fixture(scope="module")
def client(model_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=model_server.v1, api_key="sk-local", max_retries=0, timeout=300)


def _schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name.replace(" ", "_"), "schema": schema, "strict": True}}


def _constrained(client: openai.OpenAI, model: str, name: str, schema: dict[str, Any], prompt: str,
                 stream: bool) -> tuple[str, str]:
    """The text and finish reason of one constrained request, streamed or not."""
    args: dict[str, Any] = {"model": model, "max_tokens": 160, "temperature": 0.7, "seed": 7,
                            "messages": [{"role": "user", "content": f"{prompt} Answer in JSON."}],
                            "response_format": _schema_format(name, schema)}
    if not stream:
        r = client.chat.completions.create(**args)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", ""
    for chunk in client.chat.completions.create(stream=True, **args):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def _free(client: openai.OpenAI, model: str, prompt: str) -> str:
    r = client.chat.completions.create(model=model, max_tokens=48, temperature=0,
                                       messages=[{"role": "user", "content": prompt}])
    return r.choices[0].finish_reason


@pytest.mark.parametrize("model", [SMOL, TINY])
def test_every_schema_validates_batched_with_free_requests(client: openai.OpenAI, model: str) -> None:
    """All schemas at once, half streamed, with unconstrained requests decoding in the same steps."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(SCHEMAS) + len(FREE_PROMPTS)) as pool:
        free = [pool.submit(_free, client, model, p) for p in FREE_PROMPTS]
        runs = {name: (schema, pool.submit(_constrained, client, model, name, schema, prompt, i % 2 == 1))
                for i, (name, schema, prompt) in enumerate(SCHEMAS)}
        outcomes = {name: (schema, future.result()) for name, (schema, future) in runs.items()}
        assert all(f.result() in ("stop", "length") for f in free)
    stopped = 0
    for name, (schema, (text, finish)) in outcomes.items():
        assert finish in ("stop", "length"), (name, finish)
        if finish == "stop":
            stopped += 1
            value = json.loads(text)
            jsonschema.validate(value, schema, format_checker=CHECKER)
    # The test would prove nothing if every output were cut: most finish well inside 160 tokens.
    assert stopped >= len(SCHEMAS) * 3 // 4, {n: o[1] for n, o in outcomes.items()}


def test_json_object_mode(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=SMOL, max_tokens=120, temperature=0,
                                       messages=[{"role": "user", "content": "Describe a cat in JSON."}],
                                       response_format={"type": "json_object"})
    choice = r.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # a length cut is reported as such, and is still the start of an object
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


def test_a_length_cut_is_reported(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    r = client.chat.completions.create(model=SMOL, max_tokens=6, temperature=0,
                                       messages=[{"role": "user", "content": "Write a long story."}],
                                       response_format=_schema_format("story", schema))
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith('{"story": "')


def test_unenforceable_keywords_are_refused_by_name(client: openai.OpenAI) -> None:
    for schema, keyword in [({"type": "array", "uniqueItems": True}, "uniqueItems"),
                            ({"not": {"type": "string"}}, "not"),
                            ({"type": "string", "format": "hostname-ish"}, "hostname-ish")]:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=SMOL, max_tokens=8, messages=[{"role": "user", "content": "x"}],
                                           response_format=_schema_format("x", schema))
        assert keyword in info.value.message and info.value.status_code == 400


def test_json_format_and_tools_cannot_both_hold(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="cannot both hold"):
        client.chat.completions.create(model=SMOL, max_tokens=8, messages=[{"role": "user", "content": "x"}],
                                       tools=[WEATHER], response_format={"type": "json_object"})


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "strict": True,
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 30},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city", "strict": True,
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 30}}}}}
TOOL_PROMPTS = ["What's the weather in Paris?", "Is it raining in Tokyo?", "What time is it in Lima?",
                "Weather and time in Oslo, please.", "Hello!"]


def _validate_calls(calls: Any, tools: list[dict[str, Any]]) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls, "no tool call"
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


@pytest.mark.parametrize("model", [SMOL, TINY])
def test_required_tool_calls_parse_and_validate(client: openai.OpenAI, model: str) -> None:
    tools = [WEATHER, TIME]

    def ask(prompt: str) -> Any:
        return client.chat.completions.create(model=model, max_tokens=120, temperature=0.7, seed=3,
                                              messages=[{"role": "user", "content": prompt}],
                                              tools=tools, tool_choice="required")

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(TOOL_PROMPTS)) as pool:
        results = list(pool.map(ask, TOOL_PROMPTS))
    finished = [r for r in results if r.choices[0].finish_reason == "tool_calls"]
    assert len(finished) >= len(results) - 1, [r.choices[0].finish_reason for r in results]
    for r in finished:
        _validate_calls(r.choices[0].message.tool_calls, tools)


def test_named_function_and_parallel_calls_off(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=SMOL, max_tokens=120, temperature=0,
                                       messages=[{"role": "user", "content": "Weather and time in Oslo?"}],
                                       tools=[WEATHER, TIME], parallel_tool_calls=False,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_time"]
    _validate_calls(calls, [TIME])


def test_streamed_forced_call(client: openai.OpenAI) -> None:
    calls = []
    for chunk in client.chat.completions.create(model=SMOL, max_tokens=120, temperature=0, stream=True,
                                                messages=[{"role": "user", "content": "Weather in Rome?"}],
                                                tools=[WEATHER], tool_choice="required"):
        if chunk.choices and chunk.choices[0].delta.tool_calls:
            calls += chunk.choices[0].delta.tool_calls
    assert calls and all(c.function.name == "get_weather" for c in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_strict_function_under_auto_holds_its_arguments(client: openai.OpenAI) -> None:
    """With tool_choice auto the model may answer in text; any call it opens is held to the schema."""
    r = client.chat.completions.create(model=TINY, max_tokens=200, temperature=1.0, seed=11,
                                       messages=[{"role": "user", "content": "Weather in Paris?"}],
                                       tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.message.tool_calls:
        _validate_calls(choice.message.tool_calls, [WEATHER])


def test_unknown_named_function_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="not among the request's tools"):
        client.chat.completions.create(model=SMOL, max_tokens=8, messages=[{"role": "user", "content": "x"}],
                                       tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})


def test_responses_json_schema_and_forced_call(client: openai.OpenAI) -> None:
    name, schema, prompt = SCHEMAS[0]
    r = client.responses.create(model=SMOL, input=prompt, max_output_tokens=120, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": schema,
                                                 "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"
    fn = {"type": "function", "name": "get_weather", "strict": True,
          "parameters": WEATHER["function"]["parameters"]}
    r = client.responses.create(model=SMOL, input="Weather in Paris?", max_output_tokens=120, temperature=0,
                                tools=[fn], tool_choice="required")
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), fn["parameters"])
