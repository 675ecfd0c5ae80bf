"""The generated models refuse unknown fields and wrong types where the pinned specs say so."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from swama.generated import anthropic_models as am
from swama.generated import decisions_models as dm
from swama.generated import openai_models as om
from swama.generated import systemone_models as sm

DECISION = {"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "i"}]}
CHOICE = {"type": "choice", "instructions": "i", "choices": [{"value": "a"}, {"value": True}]}
SYSTEMONE = {"model": "m", "state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGE = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def blocks(*content: dict[str, Any], role: str = "user") -> list[dict[str, Any]]:
    return [{"role": role, "content": list(content)}]


def merged(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**base, **changes}


REFUSED = [
    # Decisions: strict at every level.
    (dm.DecisionCreateRequest, merged(DECISION, temperature=1)),
    (dm.DecisionCreateRequest, merged(DECISION, questions=[{"type": "predicate", "instructions": "i", "x": 1}])),
    (dm.DecisionCreateRequest, merged(DECISION, questions=[{**CHOICE, "choices": [{"value": "a", "x": 1},
                                                                                   {"value": "b"}]}])),
    (dm.DecisionCreateRequest, merged(DECISION, input=[{"role": "user", "content": "x", "extra": 1}])),
    (dm.DecisionCreateRequest, merged(DECISION, questions=[{**CHOICE, "choices": [{"value": 1}, {"value": 2}]}])),
    (dm.DecisionCreateRequest, merged(DECISION, questions=[{"type": "predicate", "instructions": 5}])),
    (dm.DecisionCreateRequest, merged(DECISION, questions=[{"type": "yes_no", "instructions": "i"}])),
    (dm.DecisionCreateRequest, merged(DECISION, questions=[])),
    (dm.DecisionCreateRequest, merged(DECISION, questions=[{"type": "predicate", "instructions": "i"}] * 201)),
    (dm.DecisionCreateRequest, merged(DECISION, safety_identifier="x" * 129)),
    (dm.DecisionCreateRequest, merged(DECISION, model=7)),
    (dm.DecisionCreateRequest, merged(DECISION, input=[{"role": "assistant", "content": "x"}])),
    # System One: unknown keys inside a question or noul criteria; wrong types.
    (sm.SystemOneRequest, merged(SYSTEMONE, questions={"q": {"type": "noul", "instructions": "i", "x": 1}})),
    (sm.SystemOneRequest, merged(SYSTEMONE, questions={"q": {"type": "noul", "instructions": "i",
                                                             "criteria": {"yes": "y"}}})),
    (sm.SystemOneRequest, merged(SYSTEMONE, questions={"q": {"type": "maybe"}})),
    (sm.SystemOneRequest, merged(SYSTEMONE, model=1)),
    (sm.SystemOneRequest, merged(SYSTEMONE, chat_template_kwargs={"enable_thinking": True})),
    (sm.SystemOneRequest, merged(SYSTEMONE, images=[1, 2, 3, 4, 5])),
    # OpenAI: wrong types are refused, not coerced.
    (om.CreateChatCompletionRequest, merged(CHAT, temperature="0.5")),
    (om.CreateChatCompletionRequest, merged(CHAT, max_tokens=1.5)),
    (om.CreateChatCompletionRequest, merged(CHAT, stream="true")),
    (om.CreateChatCompletionRequest, merged(CHAT, messages=[{"role": "wizard", "content": "x"}])),
    (om.CreateChatCompletionRequest, {"messages": CHAT["messages"]}),
    (om.CreateResponse, {"model": "m", "input": "x", "temperature": "hot"}),
    # Narrowed to the stateless subset: hosted tools and server-side state are not in the schema.
    (om.CreateResponse, {"model": "m", "input": "x", "tools": [{"type": "web_search_2025_08_26"}]}),
    (om.CreateResponse, {"model": "m", "input": "x", "previous_response_id": "resp_1"}),
    (om.CreateEmbeddingRequest, {"model": "m", "input": {"text": "x"}}),
    # Anthropic Messages: strict at every level, narrowed to the blocks and tools served.
    (am.AnthropicMessageCreateParams, merged(MESSAGE, unknown=1)),
    (am.AnthropicMessageCreateParams, {"model": "m", "messages": MESSAGE["messages"]}),  # max_tokens required
    (am.AnthropicMessageCreateParams, merged(MESSAGE, stream="true")),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, temperature=1.5)),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, messages=[{"role": "system", "content": [{"type": "image"}]}])),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, context_management={"edits": [{"type": "compact_20260112"}]})),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, messages=blocks(
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}))),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, messages=blocks(
        {"type": "image", "source": {"type": "file", "file_id": "file_1"}}))),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, messages=blocks(
        {"type": "text", "text": "x", "citations": [{"type": "char_location", "cited_text": "x"}]}))),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, messages=blocks({"type": "text", "text": "x", "extra": 1}))),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, tools=[{"type": "web_search_20250305", "name": "web_search"}])),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, tool_choice={"type": "required"})),
    (am.AnthropicMessageCountTokensParams, merged(MESSAGE)),  # no max_tokens on count_tokens
]

ACCEPTED = [
    (dm.DecisionCreateRequest, merged(DECISION, questions=[CHOICE], safety_identifier=None)),
    (dm.DecisionCreateRequest, merged(DECISION, input=[{"role": "user", "type": "message", "content": [
        {"type": "input_text", "text": "x"}, {"type": "input_image", "image_url": "data:image/png;base64,AA",
                                              "detail": "low"}]}])),
    (sm.SystemOneRequest, merged(SYSTEMONE, unknown_top_level="ignored", images=[],
                                 chat_template_kwargs={"enable_thinking": False})),
    (sm.SystemOneRequest, merged(SYSTEMONE, state={"a": [1]}, questions={
        "c": {"type": "choice", "instructions": "i", "criteria": {"a": None, "b": {"k": 1}}},
        "s": {"type": "score", "instructions": "i", "criteria": ["lo", "hi"]}})),
    (om.CreateChatCompletionRequest, merged(CHAT, temperature=1, stop=None, max_tokens=5)),
    (om.CreateResponse, {"model": "m", "input": "x", "tools": [{"type": "web_search",
                                                                "external_web_access": False}]}),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, stream=True, temperature=0.5, top_p=1, top_k=40)),
    (am.AnthropicMessageCreateParams, merged(MESSAGE, messages=[*MESSAGE["messages"], {"role": "system", "content": "x"}],
                                             context_management={"edits": [{"type": "clear_thinking_20251015",
                                                                            "keep": "all"}]})),
    (am.AnthropicMessageCreateParams, merged(
        MESSAGE, system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[
            *blocks({"type": "text", "text": "look", "citations": None},
                    {"type": "image", "source": PNG}, {"type": "image", "source": {"type": "url", "url": "https://x"}}),
            *blocks({"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "redacted_thinking", "data": "d"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}, role="assistant"),
            *blocks({"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
                     "content": [{"type": "text", "text": "r"}, {"type": "image", "source": PNG}]}),
        ],
        tools=[{"name": "f", "description": "d", "input_schema": {"type": "object", "properties": {}},
                "type": "custom", "strict": True}],
        tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 1024}, metadata={"user_id": "u"}, stop_sequences=["x"])),
    (am.AnthropicMessageCountTokensParams, {"model": "m", "messages": MESSAGE["messages"], "system": "s",
                                            "thinking": {"type": "adaptive"}, "tool_choice": {"type": "none"}}),
]


@pytest.mark.parametrize(("model", "payload"), REFUSED, ids=lambda v: getattr(v, "__name__", None))
def test_refused(model: type[pydantic.BaseModel], payload: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        model.model_validate(payload)


@pytest.mark.parametrize(("model", "payload"), ACCEPTED, ids=lambda v: getattr(v, "__name__", None))
def test_accepted(model: type[pydantic.BaseModel], payload: dict[str, Any]) -> None:
    model.model_validate(payload)


def test_choice_values_keep_their_json_type() -> None:
    parsed = dm.DecisionCreateRequest.model_validate(merged(DECISION, questions=[CHOICE]))
    values = [c.value.root for c in parsed.questions[0].root.choices]
    assert values == ["a", True] and type(values[1]) is bool


def test_nullable_response_fields_accept_null() -> None:
    # `finish_reason: null` in a stream chunk is valid per the spec (needs --strict-nullable).
    om.CreateChatCompletionStreamResponse.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]})


def test_anthropic_answers_and_errors_parse() -> None:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
               "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 4},
               "content": [{"type": "thinking", "thinking": "t", "signature": "s"}, {"type": "text", "text": "x"},
                           {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}
    am.AnthropicMessage.model_validate(message)
    with pytest.raises(pydantic.ValidationError):
        am.AnthropicMessage.model_validate({**message, "extra": 1})
    am.AnthropicErrorResponse.model_validate({"type": "error", "error": {"type": "request_too_large", "message": "m"}})
