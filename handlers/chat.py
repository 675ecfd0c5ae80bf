"""POST /v1/chat/completions: OpenAI chat completions over the shared generator."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pydantic
from fastapi import Response
from fastapi.responses import StreamingResponse
from pydantic_core import ErrorDetails

from swama.engine.errors import EngineError
from swama.engine.generator import OUT_OF_RANGE, ChatRequest, Finished, TextDelta, ToolCallEvent
from swama.generated.openai_models import ChatCompletionTool, CreateChatCompletionRequest
from swama.handlers.chat_request import (
    Turn,
    attach_images,
    chat_request,
    function_tool,
    image_refs,
    json_object,
    sampling,
    tool_call,
)
from swama.handlers.dispatch import DEFAULT_RULES, Call, RouteRules, route
from swama.handlers.errors import ApiError, bad_request
from swama.handlers.images import ImageRef, valid_image_url
from swama.handlers.streaming import collect_or_cancel, start_stream
from swama.handlers.validation import openai_schema_error, user_path

CHAT_ROLES = "Must be 'system', 'user', 'assistant', or 'tool'"
# Fields the schema narrows to the one value this server honours: any other value is refused by name.
SINGLE_VALUED = frozenset({"n", "logprobs", "modalities", "response_format"})
# Ranges of the swama extensions and token counts: the engine's wording (Sampling.check).
ENGINE_RANGES = frozenset({"top_k", "min_p", "repetition_penalty", "repetition_context_size", "max_tokens",
                           "max_completion_tokens"})
EXTENSION_TYPES = frozenset({"top_k", "min_p", "repetition_penalty", "repetition_context_size"})
RANGE_ERRORS = frozenset({"greater_than_equal", "less_than_equal"})


def _value(node: Any) -> Any:
    """A generated RootModel's value (the generator wraps `X | null` fields in one)."""
    return node.root if isinstance(node, pydantic.RootModel) else node


def _worded(error: ErrorDetails, data: Any) -> ApiError | None:
    path = user_path(error["loc"], data)
    top, kind = path[0] if path else None, error["type"]
    if (kind == "extra_forbidden" and len(path) == 1) or (top in SINGLE_VALUED and len(path) <= 2):
        return DEFAULT_RULES.unhandled(str(top))
    if top == "messages" and len(path) == 2 and kind in ("union_tag_invalid", "union_tag_not_found"):
        message = data["messages"][path[1]]
        role = message.get("role") if isinstance(message, dict) else None
        return bad_request(f"Invalid role: {role}. {CHAT_ROLES}", param=f"messages.{path[1]}.role")
    if top == "messages" and len(path) == 4 and path[2] == "content" and kind in (
            "union_tag_invalid", "union_tag_not_found"):
        part = data["messages"][path[1]]["content"][path[3]]
        where = f"messages.{path[1]}.content.{path[3]}"
        return bad_request(f"Content part type '{part.get('type')}' is not supported by this server.",
                           code="unsupported_content", param=where)
    if top == "messages" and len(path) == 4 and path[2] == "tool_calls" and kind == "union_tag_invalid":
        call_type = data["messages"][path[1]]["tool_calls"][path[3]]["type"]
        if isinstance(call_type, str):  # custom tool calls: custom tools are not served
            return bad_request(f"Tool call type '{call_type}' is not supported by this server; only function "
                               "tool calls are.", code="unsupported_value",
                               param=f"messages.{path[1]}.tool_calls.{path[3]}")
    if top == "messages" and len(path) == 1:
        return bad_request("Invalid request payload or missing messages", param="messages")
    if top == "context_limit":
        return bad_request("'context_limit' must be a positive integer.", param="context_limit")
    if top in ENGINE_RANGES and kind in RANGE_ERRORS:
        return ApiError(400, OUT_OF_RANGE, code="invalid_request")
    if top in EXTENSION_TYPES:
        return bad_request(f"'{top}' must be a number.", code="invalid_type", param=str(top))
    if top == "tools" and len(path) >= 2:
        return bad_request("Tools require a name and an object parameter schema.", param=f"tools.{path[1]}")
    return None


def schema_error(exc: pydantic.ValidationError, data: Any = None) -> ApiError:
    """The route's own wording where it has one (refused fields first), else the OpenAI default."""
    errors = exc.errors(include_url=False)
    worded = [w for w in (_worded(e, data) for e in errors) if w is not None]
    refused = [w for w in worded if w.code == "unsupported_parameter"]
    return (refused or worded or [openai_schema_error(exc, data)])[0]


# Every field the handler acts on, or accepts with a stated local meaning (see the overlay); a field
# a spec change adds to the model is refused until it is listed here.
HANDLED = frozenset({
    "model", "messages", "stream", "temperature", "top_p", "max_tokens", "max_completion_tokens",
    "presence_penalty", "frequency_penalty", "seed", "stop", "tools", "tool_choice", "n", "logprobs",
    "modalities", "response_format", "top_k", "min_p", "repetition_penalty", "repetition_context_size",
    "context_limit", "stream_options", "parallel_tool_calls", "store", "user", "safety_identifier",
    "prompt_cache_key", "metadata",
})
RULES = RouteRules(schema_error=schema_error, handled=HANDLED)


def _parts(content: Any, where: str) -> list[str | ImageRef]:
    content = _value(content)
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    parts: list[str | ImageRef] = []
    for j, part in enumerate(_value(p) for p in content):
        kind = str(part.type)
        if kind == "text":
            parts.append(part.text)
        elif kind == "refusal":  # an assistant turn's refusal is what it said
            parts.append(part.refusal)
        elif kind == "image_url":
            url = str(part.image_url.url)
            if not valid_image_url(url):
                raise bad_request("Invalid image URL", code="invalid_image", param=f"{where}.content.{j}")
            parts.append(ImageRef(f"{where}.content.{j}", url))
        else:
            raise bad_request(f"Content part type '{kind}' is not supported by this server.",
                              code="unsupported_content", param=f"{where}.content.{j}")
    return parts


def _tool_calls(message: Any, where: str) -> list[dict[str, Any]]:
    calls = []
    for k, entry in enumerate(_value(message.tool_calls) or []):
        call = _value(entry)  # a function call: the schema takes no other kind
        arguments = json_object(call.function.arguments)
        if arguments is None:
            raise bad_request(f"Tool '{call.function.name}' requires JSON object arguments or parameters",
                              param=f"{where}.tool_calls.{k}")
        calls.append(tool_call(call.id, call.function.name, arguments))
    return calls


def turns_from(messages: list[Any]) -> list[Turn]:
    turns = []
    for i, entry in enumerate(messages):
        message = _value(entry)
        role = str(message.role)
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise bad_request(f"Invalid role: {role}. {CHAT_ROLES}", param=f"messages.{i}.role")
        turn = Turn("system" if role == "developer" else role, _parts(message.content, f"messages.{i}"))
        if role == "assistant":
            turn.tool_calls = _tool_calls(message, f"messages.{i}")
        if role == "tool":
            turn.tool_call_id = message.tool_call_id
        turns.append(turn)
    return turns


def tools_from(tools: list[ChatCompletionTool] | None) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools or []):
        fn = tool.function
        if not fn.name:
            raise bad_request("Tools require a name and an object parameter schema.", param=f"tools.{i}")
        params = fn.parameters.model_dump() if fn.parameters is not None else None
        out.append(function_tool(fn.name, fn.description, params))
    return out


def request_from(request: CreateChatCompletionRequest, context_limit: int) -> tuple[ChatRequest, list[ImageRef]]:
    stop = _value(request.stop)
    stop = [stop] if isinstance(stop, str) else list(_value(stop) or [])
    max_tokens = _value(request.max_completion_tokens)
    if max_tokens is None:
        max_tokens = _value(request.max_tokens)
    options = sampling(
        temperature=_value(request.temperature), top_p=_value(request.top_p), top_k=request.top_k,
        min_p=request.min_p, repetition_penalty=_value(request.repetition_penalty),
        repetition_context_size=request.repetition_context_size,
        presence_penalty=_value(request.presence_penalty), frequency_penalty=_value(request.frequency_penalty),
        seed=request.seed)
    choice = _value(request.tool_choice)
    turns = turns_from(request.messages)
    chat = chat_request(turns, sampling=options, max_tokens=max_tokens, stop=stop,
                        tools=tools_from(request.tools), tool_choice=choice if isinstance(choice, str) else None,
                        context_limit=request.context_limit or context_limit)
    return chat, image_refs(turns)


def _wire_call(index: int, call: Any) -> dict[str, Any]:
    return {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _usage(done: Finished) -> dict[str, Any]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


@route(RULES)
async def create_chat_completion(call: Call, parsed: CreateChatCompletionRequest) -> Response | dict[str, Any]:
    engine = call.engine
    request, images = request_from(parsed, call.settings.context_limit)
    model = str(_value(parsed.model))
    model_id = engine.resolve_language_model(model)
    await attach_images(request, images, engine.installed(model_id))
    ident, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())
    events = engine.chat(model_id, request)
    if parsed.stream:
        # Errors found before the first token (context limit, template) still get a plain 4xx.
        events = await start_stream(events)
        return StreamingResponse(_sse(events, ident, created, model), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    text, calls, done = [], [], None
    async for event in collect_or_cancel(call.request, events):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, ToolCallEvent):
            calls.append(event.call)
        elif isinstance(event, Finished):
            done = event
    if done is None:
        raise ApiError(499, "The client closed the request.", code="cancelled")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text), "refusal": None}
    if calls:
        message["tool_calls"] = [_wire_call(i, c) for i, c in enumerate(calls)]
        for c in message["tool_calls"]:
            c.pop("index")
    return {"id": ident, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": done.finish_reason,
                         "logprobs": None}],
            "usage": _usage(done)}


async def _sse(events: AsyncIterator[Any], ident: str, created: int, model: str) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        body = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    yield chunk({"role": "assistant", "content": ""})
    index = 0
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                yield chunk({"content": event.text})
            elif isinstance(event, ToolCallEvent):
                yield chunk({"tool_calls": [_wire_call(index, event.call)]})
                index += 1
            elif isinstance(event, Finished):
                yield chunk({}, event.finish_reason, usage=_usage(event))
    except EngineError as exc:
        yield chunk({}, "error", error={"message": exc.message, "type": "request_error"})
    finally:
        await events.aclose()
    yield b"data: [DONE]\n\n"
