"""/v1/responses output: event order, sequence numbers, ids, and schema validity of every payload."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from swama.engine.text.generator import Event, Finished, TextDelta, ToolCallEvent
from swama.engine.text.tool_calls import ToolCall
from swama.generated import openai_models as om
from swama.generated.routes import OPERATIONS
from swama.handlers.http.pipeline import parse_json_request
from swama.handlers.routes.responses import ROUTE_RULES, ResponseRequest, response_request
from swama.handlers.routes.responses_render import (
    ResponseStream,
    final_response,
    function_call_item,
    message_item,
    new_response_id,
    response_object,
    sse_frame,
    usage_payload,
)

TOOLS = [{"type": "function", "name": "exec_command", "description": "Run a command", "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
         {"type": "function", "name": "get_goal"},
         {"type": "web_search", "external_web_access": False}]

EVENT_CLASSES = {
    "response.created": om.ResponseCreatedEvent,
    "response.in_progress": om.ResponseInProgressEvent,
    "response.output_item.added": om.ResponseOutputItemAddedEvent,
    "response.output_item.done": om.ResponseOutputItemDoneEvent,
    "response.content_part.added": om.ResponseContentPartAddedEvent,
    "response.content_part.done": om.ResponseContentPartDoneEvent,
    "response.output_text.delta": om.ResponseTextDeltaEvent,
    "response.output_text.done": om.ResponseTextDoneEvent,
    "response.function_call_arguments.delta": om.ResponseFunctionCallArgumentsDeltaEvent,
    "response.function_call_arguments.done": om.ResponseFunctionCallArgumentsDoneEvent,
    "response.completed": om.ResponseCompletedEvent,
    "response.incomplete": om.ResponseIncompleteEvent,
    "response.failed": om.ResponseFailedEvent,
}
# Required by the pinned schema, several of them nullable: they must be present even when null.
REQUIRED_RESPONSE_FIELDS = {"error", "incomplete_details", "instructions", "metadata", "temperature", "top_p",
                            "tools", "tool_choice", "parallel_tool_calls", "output", "model", "created_at",
                            "object", "id"}
HEX32 = "[0-9a-f]{32}"


def request(**fields: Any) -> ResponseRequest:
    body = json.dumps({"model": "local-model", "input": "hi", **fields}).encode()
    parsed = parse_json_request(OPERATIONS["createResponse"], ROUTE_RULES, body)
    return response_request(parsed, context_limit=4096)


def call(name: str = "exec_command", arguments: str = '{"cmd": "ls", "a": [1, 2]}', id: str = "call_abc") -> ToolCall:
    return ToolCall(name, arguments, id)


def done(reason: str = "stop", prompt: int = 7, completion: int = 3) -> Finished:
    return Finished(reason, prompt, completion, 0.01, 0.02)


def wire(frames: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each frame through the SSE encoding and back, validated against the pinned schema."""
    payloads = []
    for event_type, payload in frames:
        raw = sse_frame(event_type, payload).decode()
        head, data = raw.split("\n", 1)
        assert head == f"event: {event_type}" and data.startswith("data: ") and data.endswith("\n\n")
        decoded = json.loads(data[len("data: "):])
        assert decoded == payload and decoded["type"] == event_type
        om.ResponseStreamEvent.model_validate(decoded)
        EVENT_CLASSES[event_type].model_validate(decoded)
        if "response" in decoded:
            check_response(decoded["response"])
        payloads.append(decoded)
    return payloads


def check_response(obj: dict[str, Any]) -> om.Response:
    assert REQUIRED_RESPONSE_FIELDS <= obj.keys()
    return om.Response.model_validate(obj)


def run(req: ResponseRequest, events: list[Event]) -> list[dict[str, Any]]:
    payloads = wire(list(ResponseStream(req).run(events)))
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    return payloads


def types(payloads: list[dict[str, Any]]) -> list[str]:
    return [p["type"] for p in payloads]


def terminal(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    return payloads[-1]["response"]


TEXT_ITEM = ["response.output_item.added", "response.content_part.added"]
TEXT_CLOSE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
CALL = ["response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]
START = ["response.created", "response.in_progress"]


def test_text_only() -> None:
    payloads = run(request(), [TextDelta("Hel"), TextDelta("lo"), done()])
    assert types(payloads) == [*START, *TEXT_ITEM, "response.output_text.delta", "response.output_text.delta",
                               *TEXT_CLOSE, "response.completed"]
    item_id = payloads[2]["item"]["id"]
    assert re.fullmatch(f"msg_{HEX32}", item_id)
    assert payloads[2]["item"] == {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress",
                                   "content": []}
    assert payloads[3]["part"] == {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    assert [p["delta"] for p in payloads[4:6]] == ["Hel", "lo"]
    for p in payloads[2:9]:
        assert p["output_index"] == 0
    for p in payloads[3:8]:
        assert (p["item_id"], p["content_index"]) == (item_id, 0)
    assert payloads[4]["logprobs"] == [] and payloads[6]["logprobs"] == []
    assert payloads[6]["text"] == "Hello" and payloads[7]["part"]["text"] == "Hello"
    final = message_item(item_id, "Hello", "completed")
    assert payloads[8]["item"] == final
    response = terminal(payloads)
    assert (response["status"], response["output"], response["incomplete_details"]) == ("completed", [final], None)
    assert response["usage"] == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10,
                                 "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                                 "output_tokens_details": {"reasoning_tokens": 0}}


def test_tool_call_only_gets_index_zero() -> None:
    payloads = run(request(tools=TOOLS), [ToolCallEvent(call()), done("tool_calls")])
    assert types(payloads) == [*START, *CALL, "response.completed"]
    added, delta, args_done, item_done = payloads[2:6]
    item_id = added["item"]["id"]
    assert re.fullmatch(f"fc_{HEX32}", item_id)
    assert all(p["output_index"] == 0 for p in (added, delta, args_done, item_done))
    arguments = '{"a":[1,2],"cmd":"ls"}'
    assert added["item"] == {"id": item_id, "type": "function_call", "call_id": "call_abc", "name": "exec_command",
                             "arguments": "", "status": "in_progress"}
    assert (delta["item_id"], delta["delta"]) == (item_id, arguments)
    assert (args_done["item_id"], args_done["name"], args_done["arguments"]) == (item_id, "exec_command", arguments)
    assert item_done["item"] == {**added["item"], "arguments": arguments, "status": "completed"}
    assert terminal(payloads)["output"] == [item_done["item"]]


def test_text_then_tool_call() -> None:
    payloads = run(request(tools=TOOLS), [TextDelta("Let me look."), ToolCallEvent(call()), done("tool_calls")])
    assert types(payloads) == [*START, *TEXT_ITEM, "response.output_text.delta", *CALL, *TEXT_CLOSE,
                               "response.completed"]
    msg_id, fc_id = payloads[2]["item"]["id"], payloads[5]["item"]["id"]
    assert [p["output_index"] for p in payloads[2:-1]] == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0]
    output = terminal(payloads)["output"]
    assert [(o["id"], o["type"]) for o in output] == [(msg_id, "message"), (fc_id, "function_call")]
    assert output[0]["content"][0]["text"] == "Let me look."


def test_tool_call_then_text_keeps_emission_order() -> None:
    payloads = run(request(tools=TOOLS), [ToolCallEvent(call()), TextDelta("Done."), done("tool_calls")])
    assert types(payloads) == [*START, *CALL, *TEXT_ITEM, "response.output_text.delta", *TEXT_CLOSE,
                               "response.completed"]
    assert payloads[2]["output_index"] == 0 and payloads[6]["output_index"] == 1
    assert [o["type"] for o in terminal(payloads)["output"]] == ["function_call", "message"]


def test_two_tool_calls_in_sequence() -> None:
    payloads = run(request(tools=TOOLS), [ToolCallEvent(call(id="call_1")),
                                          ToolCallEvent(call("get_goal", "{}", "call_2")), done("tool_calls")])
    assert types(payloads) == [*START, *CALL, *CALL, "response.completed"]
    output = terminal(payloads)["output"]
    assert [(o["call_id"], o["name"], o["arguments"]) for o in output] == [
        ("call_1", "exec_command", '{"a":[1,2],"cmd":"ls"}'), ("call_2", "get_goal", "{}")]
    assert output[0]["id"] != output[1]["id"]


def test_length_limited_is_incomplete() -> None:
    payloads = run(request(max_output_tokens=2), [TextDelta("Once upon"), done("length", completion=2)])
    assert types(payloads) == [*START, *TEXT_ITEM, "response.output_text.delta", *TEXT_CLOSE,
                               "response.incomplete"]
    assert payloads[-2]["item"]["status"] == "incomplete"
    response = terminal(payloads)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete" and response["max_output_tokens"] == 2


def test_length_without_text() -> None:
    payloads = run(request(), [done("length", completion=0)])
    assert types(payloads) == [*START, "response.incomplete"]
    assert terminal(payloads)["output"] == []


def test_no_output() -> None:
    payloads = run(request(), [done(completion=0)])
    assert types(payloads) == [*START, "response.completed"]
    assert terminal(payloads)["output"] == []


def test_start_events_are_in_progress() -> None:
    req = request(instructions="Be brief.", tools=TOOLS, temperature=0.2)
    stream = ResponseStream(req, response_id="resp_" + "a" * 32, created_at=1700000000)
    payloads = wire(stream.start())
    for p in payloads:
        r = p["response"]
        assert (r["status"], r["output"], r["usage"], r["id"], r["created_at"]) == (
            "in_progress", [], None, "resp_" + "a" * 32, 1700000000)
        assert (r["instructions"], r["temperature"], r["tool_choice"]) == ("Be brief.", 0.2, "auto")
    assert [p["sequence_number"] for p in payloads] == [0, 1]


def test_sequence_numbers_continue_across_calls() -> None:
    stream = ResponseStream(request())
    frames = [*stream.start(), *stream.feed(TextDelta("a")), *stream.feed(TextDelta("b")), *stream.feed(done())]
    numbers = [p["sequence_number"] for _, p in frames]
    assert numbers == list(range(len(frames)))
    assert stream.finished and stream.feed(TextDelta("late")) == [] and stream.failed("late") == []


def test_failed_after_stream_began() -> None:
    stream = ResponseStream(request())
    frames = [*stream.start(), *stream.feed(TextDelta("par")), *stream.failed("The model crashed.")]
    payloads = wire(frames)
    assert types(payloads)[-1] == "response.failed"
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    response = terminal(payloads)
    assert response["status"] == "failed" and response["usage"] is None
    assert response["error"] == {"code": "server_error", "message": "The model crashed."}
    assert stream.finished and stream.feed(done()) == [] and stream.failed("again") == []


def test_ids() -> None:
    assert re.fullmatch(f"resp_{HEX32}", new_response_id())
    stream = ResponseStream(request())
    assert re.fullmatch(f"resp_{HEX32}", stream.id)
    payloads = wire(list(stream.run([TextDelta("x"), ToolCallEvent(call()), done()])))
    assert {p["response"]["id"] for p in payloads if "response" in p} == {stream.id}


def test_call_id_falls_back_to_item_id() -> None:
    item = function_call_item("fc_1", ToolCall("f", "{}", ""))
    assert item["call_id"] == "fc_1"


def test_arguments_are_sorted_json_object_strings() -> None:
    item = function_call_item("fc_1", ToolCall("f", '{"z": {"b": 1, "a": "é"}, "a": null}', "c"))
    assert item["arguments"] == '{"a":null,"z":{"a":"é","b":1}}'
    assert json.loads(item["arguments"]) == {"a": None, "z": {"a": "é", "b": 1}}


# -- the Response object -----------------------------------------------------------------------------

def test_response_object_fields() -> None:
    req = request(tools=TOOLS, temperature=1, top_p=0.9, max_output_tokens=64, parallel_tool_calls=True,
                  instructions="Be brief.")
    obj = response_object(req, id="resp_1", created_at=5, status="completed", output=[],
                          usage=usage_payload(1, 2))
    check_response(obj)
    assert obj == {
        "id": "resp_1", "object": "response", "created_at": 5, "model": "local-model", "status": "completed",
        "output": [], "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [{"type": "function", "name": "exec_command", "description": "Run a command",
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "strict": False},
                  {"type": "function", "name": "get_goal", "description": None, "parameters": {}, "strict": False}],
        "temperature": 1.0, "top_p": 0.9, "max_output_tokens": 64, "instructions": "Be brief.",
        "previous_response_id": None, "truncation": "disabled", "store": False, "background": False,
        "metadata": {}, "text": {"format": {"type": "text"}}, "top_logprobs": None, "error": None, "incomplete_details": None,
        "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3,
                  "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
        "user": None,
    }
    assert isinstance(obj["temperature"], float)


def test_response_object_defaults() -> None:
    obj = response_object(request(), id="resp_1", created_at=5, status="in_progress", output=[], usage=None)
    check_response(obj)
    assert (obj["temperature"], obj["top_p"], obj["max_output_tokens"], obj["instructions"]) == (0.6, 1.0, None, None)
    assert (obj["tools"], obj["tool_choice"], obj["parallel_tool_calls"]) == ([], "auto", True)


def test_tool_choice_none_echoes_no_tools() -> None:
    obj = final_response(request(tools=TOOLS, tool_choice="none"), [TextDelta("hi"), done()])
    check_response(obj)
    assert (obj["tool_choice"], obj["tools"]) == ("none", [])


def test_required_nullable_fields_are_enforced_by_the_schema() -> None:
    obj = final_response(request(), [TextDelta("hi"), done()])
    for key in ("error", "incomplete_details", "instructions"):
        with pytest.raises(ValueError):
            om.Response.model_validate({k: v for k, v in obj.items() if k != key})
    part = obj["output"][0]["content"][0]
    assert part["logprobs"] == []
    broken = {**obj, "output": [{**obj["output"][0], "content": [{k: v for k, v in part.items() if k != "logprobs"}]}]}
    with pytest.raises(ValueError):
        om.Response.model_validate(broken)


@pytest.mark.parametrize("events", [
    pytest.param([TextDelta("a"), TextDelta("b"), done()], id="text"),
    pytest.param([ToolCallEvent(call()), done("tool_calls")], id="call"),
    pytest.param([TextDelta("a"), ToolCallEvent(call()), done("tool_calls")], id="text-call"),
    pytest.param([ToolCallEvent(call()), TextDelta("a"), done("tool_calls")], id="call-text"),
    pytest.param([TextDelta("a"), done("length")], id="length"),
    pytest.param([done()], id="empty"),
])
def test_final_response_matches_the_stream(events: list[Event]) -> None:
    req = request(tools=TOOLS, instructions="x")
    streamed = terminal(run(req, events))
    final = final_response(req, events, response_id=streamed["id"], created_at=streamed["created_at"])
    check_response(final)

    def shape(obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "output": [{k: v for k, v in item.items() if k != "id"} for item in obj["output"]]}

    assert shape(final) == shape(streamed)
    assert json.loads(json.dumps(final)) == final


def test_streamed_items_match_the_terminal_output() -> None:
    payloads = run(request(tools=TOOLS), [TextDelta("a"), ToolCallEvent(call()), TextDelta("b"),
                                          done("tool_calls")])
    done_items = {p["output_index"]: p["item"] for p in payloads if p["type"] == "response.output_item.done"}
    assert terminal(payloads)["output"] == [done_items[i] for i in range(len(done_items))]
    assert done_items[0]["content"][0]["text"] == "ab"


def test_final_response_needs_finished() -> None:
    with pytest.raises(ValueError):
        final_response(request(), [TextDelta("a")])


def test_feed_refuses_foreign_objects() -> None:
    stream = ResponseStream(request())
    stream.start()
    with pytest.raises(TypeError):
        stream.feed("text")  # type: ignore[arg-type]


def test_sse_frame() -> None:
    frame = sse_frame("response.output_text.delta", {"type": "response.output_text.delta", "delta": "héllo\n"})
    assert frame == 'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"héllo\\n"}\n\n'.encode()
    assert frame.count(b"\n\n") == 1 and b"[DONE]" not in frame
