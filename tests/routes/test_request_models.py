"""Chat completions and responses: the generated request model is what refuses an unknown field, a
wrong type and a missing required field, and the route's schema_error words it with its documented
message; then the shared conversion to the generator's ChatRequest."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from conftest import served_schema_accepts

from swama.generated.routes import OPERATIONS
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import RouteRules, parse_json_request
from swama.handlers.routes import chat, chat_wording
from swama.handlers.routes.responses import ROUTE_RULES, response_request
from swama.handlers.routes.turns import Turn, json_object, merge_adjacent_system

CHAT_OP, RESPONSES_OP = OPERATIONS["createChatCompletion"], OPERATIONS["createResponse"]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RESPONSE = {"model": "m", "input": "hi"}

SCHEMA_REFUSALS = [
    # route, rules, body, (code, message, param)
    (CHAT_OP, chat_wording.RULES, {**CHAT, "frobnicate": 1},
     ("unsupported_parameter", "'frobnicate' is not supported by this server; it is rejected rather than ignored.",
      "frobnicate")),
    (CHAT_OP, chat_wording.RULES, {**CHAT, "n": 2},
     ("unsupported_parameter", "'n' is not supported by this server; it is rejected rather than ignored.", "n")),
    (CHAT_OP, chat_wording.RULES, {**CHAT, "stream": "yes"},
     ("invalid_type", "Invalid value at 'stream': Input should be a valid boolean.", "stream")),
    (CHAT_OP, chat_wording.RULES, {**CHAT, "min_p": "x"}, ("invalid_type", "'min_p' must be a number.", "min_p")),
    (CHAT_OP, chat_wording.RULES, {"model": "m"},
     ("invalid_value", "Invalid request payload or missing messages", "messages")),
    (CHAT_OP, chat_wording.RULES, {"messages": CHAT["messages"]},
     ("missing_required_parameter", "Missing required field 'model'.", "model")),
    (RESPONSES_OP, ROUTE_RULES, {**RESPONSE, "metadata": {}},
     ("unsupported_parameter",
      "`metadata` is not supported by this server; it is rejected rather than silently ignored", None)),
    (RESPONSES_OP, ROUTE_RULES, {**RESPONSE, "stream": "yes"},
     ("invalid_value", "Malformed request: `stream` must be a JSON boolean", None)),
    (RESPONSES_OP, ROUTE_RULES, {"model": "m"},
     ("missing_required_parameter",
      "`input` must be a non-empty string or a non-empty array of input items", None)),
    (RESPONSES_OP, ROUTE_RULES, {**RESPONSE, "input": [{"type": "function_call", "call_id": "c",
                                                        "arguments": "{}"}]},
     ("invalid_value", "Malformed request: function_call item requires `call_id` and `name`", None)),
    # arguments hold a JSON object: the schema states the braces, so "" is the schema's refusal
    (RESPONSES_OP, ROUTE_RULES, {**RESPONSE, "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                                        "arguments": ""}]},
     ("invalid_value", "Malformed request: function_call requires `arguments` as a JSON object string", None)),
    # assistant turns replay function tool calls: custom tools are not served
    (CHAT_OP, chat.RULES, {**CHAT, "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "custom", "custom": {"name": "g", "input": "free text"}}]}]},
     ("unsupported_value", "Tool call type 'custom' is not supported by this server; only function tool calls are.",
      "messages.0.tool_calls.0")),
]


@pytest.mark.parametrize(("op", "rules", "data", "expected"), SCHEMA_REFUSALS)
def test_the_generated_model_refuses_and_the_route_words_it(op: Any, rules: RouteRules, data: dict[str, Any],
                                                            expected: tuple[str, str, str | None]) -> None:
    rules.before_model(data)  # passes: the refusal below is the schema's, not a hand-written rule
    with pytest.raises(pydantic.ValidationError) as info:
        op.request_model.model_validate(data)
    worded = rules.schema_error(info.value, data)
    with pytest.raises(ApiError) as through_pipeline:
        parse_json_request(op, rules, json.dumps(data).encode())
    assert through_pipeline.value == worded
    assert (worded.status, worded.code, worded.message, worded.param) == (400, *expected)


def chat_request(**changes: Any) -> Any:
    parsed = parse_json_request(CHAT_OP, chat_wording.RULES, json.dumps({**CHAT, **changes}).encode())
    return chat.request_from(parsed, 4096)[0]


def test_chat_defaults_come_from_the_engine() -> None:
    req = chat_request()
    assert (req.sampling.temperature, req.sampling.top_p, req.max_tokens, req.stop, req.tools) == (
        0.6, 1.0, None, [], None)
    assert req.context_limit == 4096 and chat_request(context_limit=77).context_limit == 77


def test_chat_conversion() -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}]
    req = chat_request(tools=tools, stop="END", max_completion_tokens=5, max_tokens=9, temperature=0, top_k=3,
                       messages=[
                           {"role": "developer", "content": "d"},
                           {"role": "system", "content": [{"type": "text", "text": "s"}]},
                           {"role": "user", "content": "u"},
                           {"role": "assistant", "content": None, "tool_calls": [
                               {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":"x"}'}}]},
                           {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
    assert req.messages == [
        {"role": "system", "content": "d\ns"}, {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": "x"}}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1"}]
    assert req.tools == tools and req.stop == ["END"] and req.max_tokens == 5
    assert (req.sampling.temperature, req.sampling.top_k) == (0, 3)
    assert chat_request(tools=tools, tool_choice="none").tools is None


@pytest.mark.parametrize(("changes", "expected"), [
    ({"messages": [{"role": "function", "name": "f", "content": "x"}]},
     ("invalid_value", "Invalid role: function. Must be 'system', 'user', 'assistant', or 'tool'", "messages.0.role")),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": "AAAA", "format": "wav"}}]}]},
     ("unsupported_content", "Content part type 'input_audio' is not supported by this server.",
      "messages.0.content.0")),
    ({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "1"}}]}]},
     ("invalid_value", "Tool 'f' requires JSON object arguments or parameters", "messages.0.tool_calls.0")),
])
def test_chat_rules_no_schema_says(changes: dict[str, Any], expected: tuple[str, str, str]) -> None:
    with pytest.raises(ApiError) as info:
        chat_request(**changes)
    assert (info.value.code, info.value.message, info.value.param) == expected


def test_the_served_document_states_the_tool_calls_assistant_turns_take() -> None:
    custom = {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "g", "input": "x"}}]}
    function = {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert not served_schema_accepts("CreateChatCompletionRequest", {**CHAT, "messages": [custom]})
    assert served_schema_accepts("CreateChatCompletionRequest", {**CHAT, "messages": [function]})
    assert chat_request(messages=[function]).messages[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": {}}
    # the response's message still describes every kind of tool call OpenAI's does
    assert served_schema_accepts("ChatCompletionMessageToolCalls", custom["tool_calls"])


def test_responses_use_the_same_conversion() -> None:
    body = {**RESPONSE, "instructions": "i", "temperature": 1, "input": [
        {"role": "developer", "content": "d"}, {"content": "u"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":"x"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
        "tools": [{"type": "function", "name": "f"}]}
    req = response_request(parse_json_request(RESPONSES_OP, ROUTE_RULES, json.dumps(body).encode()),
                           context_limit=4096)
    assert req.chat.messages == chat_request(tools=[{"type": "function", "function": {"name": "f"}}], temperature=1,
                                             messages=[
        {"role": "system", "content": "i"}, {"role": "developer", "content": "d"}, {"role": "user", "content": "u"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":"x"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]).messages
    assert (req.chat.sampling.temperature, req.temperature, req.top_p) == (1, 1, 1.0)


def test_json_object_and_system_merging() -> None:
    assert json_object('{"a": 1}') == {"a": 1}
    assert [json_object(t) for t in ("[1]", "1", '{"a": NaN}', "", None)] == [None] * 5
    turns = [Turn("system", ["a"]), Turn("system", ["b"]), Turn("user", ["c"]), Turn("system", ["d"])]
    assert [t.message() for t in merge_adjacent_system(turns)] == [
        {"role": "system", "content": "a\nb"}, {"role": "user", "content": "c"}, {"role": "system", "content": "d"}]
