"""POST /v1/responses: the stateless subset, over the same generator as chat completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Response
from fastapi.responses import StreamingResponse

from swama.engine.errors import EngineError
from swama.engine.text.generator import Finished
from swama.generated.openai_models import CreateResponse
from swama.handlers.chat_request import attach_images
from swama.handlers.dispatch import Call, route
from swama.handlers.errors import ApiError
from swama.handlers.responses_events import (
    SSE_HEADERS,
    SSE_MEDIA_TYPE,
    ResponseStream,
    final_response,
    sse_frame,
)
from swama.handlers.responses_rules import ROUTE_RULES, ResponseRequest, response_request
from swama.handlers.streaming import collect_or_cancel, start_stream


@route(ROUTE_RULES)
async def create_response(call: Call, parsed: CreateResponse) -> Response | dict[str, Any]:
    request = response_request(parsed, context_limit=call.settings.context_limit)
    engine = call.engine
    model_id = engine.resolve_language_model(request.model)
    await attach_images(request.chat, request.images, engine.installed(model_id))
    events = engine.chat(model_id, request.chat)
    if request.stream:
        events = await start_stream(events)  # errors before the first token stay plain HTTP errors
        return StreamingResponse(_sse(request, events), media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
    collected = [event async for event in collect_or_cancel(call.request, events)]
    if not collected or not isinstance(collected[-1], Finished):
        raise ApiError(499, "The client closed the request.", code="cancelled")
    return final_response(request, collected)


async def _sse(request: ResponseRequest, events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    stream = ResponseStream(request)
    for frame in stream.start():
        yield sse_frame(*frame)
    try:
        async for event in events:
            for frame in stream.feed(event):
                yield sse_frame(*frame)
    except EngineError as exc:
        for frame in stream.failed(exc.message):
            yield sse_frame(*frame)
    finally:
        await events.aclose()
