"""POST /v1/chat/completions: the completion object and its stream of chunks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from swama.engine.client import (
    EngineError,
    Finished,
    Logprobs,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallEvent,
)
from swama.handlers.routes.turns import disk_cached, wire_token_logprobs, with_draft_tokens


def _wire_call(index: int, call: Any) -> dict[str, Any]:
    return {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _usage(done: Finished) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                             "total_tokens": done.prompt_tokens + done.completion_tokens,
                             "prompt_tokens_details": {"cached_tokens": done.cached_tokens,
                                                       **disk_cached(done.disk_cached_tokens)}}
    if done.reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": done.reasoning_tokens}
    return with_draft_tokens(usage, done.draft_tokens)


def wire_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """A choice's `logprobs`: each token with its most probable alternatives."""
    return {"content": wire_token_logprobs(entries), "refusal": None}


def completion(ident: str, created: int, model: str, text: str, calls: list[Any], done: Finished,
               logprobs: list[TokenLogprob] | None = None, reasoning: str | None = None) -> dict[str, Any]:
    """The non-streaming chat.completion object (`logprobs` None: not asked for; `reasoning`: the
    thinking of a model that thinks, None for none)."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [_wire_call(i, c) for i, c in enumerate(calls)]
        for c in message["tool_calls"]:
            c.pop("index")
    return {"id": ident, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": done.finish_reason,
                         "logprobs": wire_logprobs(logprobs) if logprobs is not None else None}],
            "usage": _usage(done)}


async def chunks(events: AsyncIterator[Any], ident: str, created: int, model: str) -> AsyncIterator[bytes]:
    pending: list[TokenLogprob] = []  # log probabilities of tokens whose text is not sent yet

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        logprobs = wire_logprobs(pending) if pending else None
        pending.clear()
        body = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    yield chunk({"role": "assistant", "content": ""})
    index = 0
    try:
        async for event in events:
            if isinstance(event, Logprobs):
                pending.extend(event.entries)
            elif isinstance(event, TextDelta):
                yield chunk({"content": event.text})
            elif isinstance(event, ReasoningDelta):
                yield chunk({"reasoning_content": event.text})
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
