"""Anthropic's shapes without a model: the error envelope by status, the event machine's order for
thinking, text and a tool call, and the stop reasons."""

from __future__ import annotations

import json

import anthropic
import pydantic
import pytest

from swama.engine.client import Finished, ReasoningDelta, TextDelta, ToolCall, ToolCallEvent
from swama.generated import anthropic_models as am
from swama.handlers.http.errors import ApiError, error_body
from swama.handlers.routes.messages_render import MessageStream, final_message


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"),
    (503, "overloaded_error"), (529, "overloaded_error")])
def test_every_status_gets_anthropics_error_type(status: int, kind: str) -> None:
    body = error_body("anthropic", ApiError(status, "why"))
    assert body == {"type": "error", "error": {"type": kind, "message": "why"}}
    am.AnthropicErrorResponse.model_validate(body)  # the pinned document's own shape


def done(reason: str = "stop", stop: str | None = None) -> Finished:
    return Finished(reason, prompt_tokens=30, completion_tokens=9, prompt_seconds=0.1, generation_seconds=0.2,
                    cached_tokens=20, reasoning_tokens=4, stop_sequence=stop)


def test_thinking_text_and_a_call_in_anthropics_order() -> None:
    call = ToolCall("get_weather", '{"city": "Paris"}', id="call_1")
    events = [ReasoningDelta("Let me "), ReasoningDelta("see."), TextDelta("Checking."), ToolCallEvent(call),
              done("tool_calls")]
    stream = MessageStream("m", "msg_1")
    frames = stream.start() + [f for e in events for f in stream.feed(e)]
    names = [name for name, _ in frames]
    assert names == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
                     "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    deltas = [p["delta"]["type"] for n, p in frames if n == "content_block_delta"]
    assert deltas == ["thinking_delta", "thinking_delta", "signature_delta", "text_delta", "input_json_delta"]
    message = stream.message
    assert message is not None and message["stop_reason"] == "tool_use"
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["content"][2]["input"] == {"city": "Paris"}
    assert message["usage"] == {"input_tokens": 10, "output_tokens": 9, "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 20}
    # The SDK's own types read every payload (a ping has none), and its Message the one the stream ends with.
    events_type = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)
    for name, payload in frames:
        if name != "ping":
            assert events_type.validate_python(json.loads(json.dumps(payload))).type == name
    assert anthropic.types.Message.model_validate(message).content[0].type == "thinking"


@pytest.mark.parametrize(("finished", "reason", "sequence"), [
    (done("stop"), "end_turn", None), (done("length"), "max_tokens", None),
    (done("stop", "END"), "stop_sequence", "END"), (done("tool_calls"), "tool_use", None)])
def test_stop_reasons(finished: Finished, reason: str, sequence: str | None) -> None:
    message = final_message("m", [TextDelta("x"), finished])
    assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


def test_an_error_after_the_stream_began_is_an_error_event() -> None:
    assert MessageStream.failed("api_error", "boom") == [
        ("error", {"type": "error", "error": {"type": "api_error", "message": "boom"}})]
