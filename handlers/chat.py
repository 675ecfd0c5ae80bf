"""POST /v1/chat/completions: OpenAI chat completions over the shared generator."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Response
from fastapi.responses import StreamingResponse

from swama.engine.errors import EngineError
from swama.engine.generator import ChatRequest, Finished, Sampling, TextDelta, ToolCallEvent
from swama.handlers.dispatch import Call, route
from swama.handlers.errors import ApiError, bad_request
from swama.handlers.streaming import collect_or_cancel, start_stream

ROLES = ("system", "user", "assistant", "tool", "developer")
UNSUPPORTED = {
    "n": lambda v: v not in (None, 1),
    "logprobs": lambda v: v not in (None, False),
    "top_logprobs": lambda v: v is not None,
    "audio": lambda v: v is not None,
    "prediction": lambda v: v is not None,
    "modalities": lambda v: v not in (None, ["text"]),
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "web_search_options": lambda v: v is not None,
}


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind == "text":
            texts.append(part["text"])
        elif kind == "image_url":
            raise bad_request("Images are not supported by this model; it has no vision processor.",
                              code="invalid_image", param=f"{where}.content.{j}")
        else:
            raise bad_request(f"Content part type '{kind}' is not supported by this server.",
                              code="unsupported_content", param=f"{where}.content.{j}")
    return "\n".join(texts)


def _tool_call(call: dict[str, Any], where: str) -> dict[str, Any]:
    fn = call.get("function") or {}
    name = fn.get("name", "")
    try:
        args = json.loads(fn.get("arguments", ""))
    except (TypeError, ValueError):
        args = None
    if not isinstance(args, dict):
        raise bad_request(f"Tool '{name}' requires JSON object arguments or parameters", param=where)
    return {"id": call.get("id"), "type": "function", "function": {"name": name, "arguments": args}}


def messages_from(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(raw):
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"Invalid role: {role}. Must be 'system', 'user', 'assistant', or 'tool'",
                              param=f"messages.{i}.role")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _text_of(m.get("content"), f"messages.{i}")}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_tool_call(c, f"messages.{i}.tool_calls.{k}") for k, c in
                                 enumerate(m["tool_calls"])]
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id", "")
        out.append(msg)
    return out


def tools_from(raw: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not raw:
        return None
    tools = []
    for i, tool in enumerate(raw):
        fn = tool.get("function") or {}
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if tool.get("type") != "function" or not fn.get("name") or not isinstance(params, dict):
            raise bad_request("Tools require a name and an object parameter schema.", param=f"tools.{i}")
        tools.append({"type": "function", "function": {"name": fn["name"], "description": fn.get("description", ""),
                                                       "parameters": params}})
    return tools


def _number(data: dict[str, Any], key: str, default: Any) -> Any:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"'{key}' must be a number.", code="invalid_type", param=key)
    return value


def request_from(data: dict[str, Any], context_limit: int) -> ChatRequest:
    for key, refused in UNSUPPORTED.items():
        if refused(data.get(key)):
            raise bad_request(f"'{key}' is not supported by this server; it is rejected rather than ignored.",
                              code="unsupported_parameter", param=key)
    if not data.get("messages"):
        raise bad_request("Invalid request payload or missing messages", param="messages")
    stop = data.get("stop")
    limit = data.get("context_limit", context_limit)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise bad_request("'context_limit' must be a positive integer.", param="context_limit")
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise bad_request("'max_tokens' must be an integer.", param="max_tokens")
    seed = data.get("seed")
    sampling = Sampling(
        temperature=_number(data, "temperature", 0.6), top_p=_number(data, "top_p", 1.0),
        top_k=int(_number(data, "top_k", 0)), min_p=_number(data, "min_p", 0.0),
        repetition_penalty=_number(data, "repetition_penalty", None),
        repetition_context_size=int(_number(data, "repetition_context_size", 20)),
        presence_penalty=_number(data, "presence_penalty", None),
        frequency_penalty=_number(data, "frequency_penalty", None),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None)
    tool_choice = data.get("tool_choice")
    tools = None if tool_choice == "none" else tools_from(data.get("tools"))
    return ChatRequest(messages=messages_from(data["messages"]), sampling=sampling, max_tokens=max_tokens,
                       stop=[stop] if isinstance(stop, str) else list(stop or []), tools=tools,
                       context_limit=limit)


def _wire_call(index: int, call: Any) -> dict[str, Any]:
    return {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _usage(done: Finished) -> dict[str, Any]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


@route()
async def create_chat_completion(call: Call, parsed: Any) -> Response | dict[str, Any]:
    data = json.loads(call.body)  # INTERIM: still re-reads the body; to be built from `parsed`
    engine = call.engine
    request = request_from(data, call.settings.context_limit)
    model = data["model"]
    model_id = engine.resolve_language_model(model)
    ident, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())
    events = engine.chat(model_id, request)
    if data.get("stream"):
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
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
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
