"""POST /v1/responses: the stateless subset, over the same generator as chat completions.

The generated `CreateResponse` refuses unknown fields, wrong types, unsupported values and
out-of-range sampling itself (worded in responses_wording). What stays here: explicit nulls,
function-call arguments that must hold a JSON object, image URLs, dropping the offline web_search
tool, the conversion shared with chat completions (turns), and the handler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Response
from fastapi.responses import StreamingResponse

from swama.engine.client import Cancelled, ChatRequest, EngineError, Finished, Task
from swama.generated.openai_models import (
    CreateResponse,
    ResponsesRequestFunctionCallItem,
    ResponsesRequestFunctionCallOutputItem,
    ResponsesRequestFunctionTool,
    ResponsesRequestImagePart,
    ResponsesRequestMessageItem,
)
from swama.handlers.http.pipeline import Call, route
from swama.handlers.http.streaming import collect_or_cancel, start_stream
from swama.handlers.media.images import ImageRef, valid_image_url
from swama.handlers.routes.responses_render import (
    SSE_HEADERS,
    SSE_MEDIA_TYPE,
    ResponseStream,
    final_response,
    sse_frame,
)
from swama.handlers.routes.responses_wording import ROUTE_RULES, check_nulls, malformed, unsupported
from swama.handlers.routes.turns import (
    Turn,
    attach_images,
    chat_request,
    function_tool,
    json_object,
    sampling,
    tool_call,
)

ROLES = {"user": "user", "developer": "system", "system": "system", "assistant": "assistant", "tool": "tool"}


@dataclass
class ResponseRequest:
    """A parsed request: what the generator runs and what the Response object echoes."""

    model: str
    chat: ChatRequest
    stream: bool = False
    instructions: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # echo form; empty for tool_choice "none"
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False
    temperature: float = 0.0
    top_p: float = 0.0
    max_output_tokens: int | None = None
    images: list[ImageRef] = field(default_factory=list)  # in order; loaded by the route


def _message_turn(item: ResponsesRequestMessageItem, where: str, images: list[ImageRef]) -> Turn:
    role = ROLES[item.role]
    if isinstance(item.content, str):
        return Turn(role, [item.content])
    parts: list[str | ImageRef] = []
    for j, part in enumerate(p.root for p in item.content.root):
        if isinstance(part, ResponsesRequestImagePart):
            if not valid_image_url(part.image_url):
                raise unsupported("input_image.image_url")
            detail = part.detail if "detail" in part.model_fields_set else None
            ref = ImageRef(f"{where}.content[{j}]", part.image_url, detail)
            images.append(ref)
            parts.append(ref)
        else:
            parts.append(part.text)
    return Turn(role, parts)


def _call_turn(item: ResponsesRequestFunctionCallItem) -> Turn:
    arguments = json_object(item.arguments)
    if arguments is None:
        raise malformed("function_call requires `arguments` as a JSON object string")
    return Turn("assistant", [], tool_calls=[tool_call(item.call_id, item.name, arguments)])


def _turns(request: CreateResponse, images: list[ImageRef]) -> list[Turn]:
    turns = [Turn("system", [request.instructions])] if request.instructions else []
    if isinstance(request.input.root, str):
        return [*turns, Turn("user", [request.input.root])]
    for i, entry in enumerate(request.input.root):
        item = entry.root
        if isinstance(item, ResponsesRequestMessageItem):
            turns.append(_message_turn(item, f"input[{i}]", images))
        elif isinstance(item, ResponsesRequestFunctionCallItem):
            turns.append(_call_turn(item))
        elif isinstance(item, ResponsesRequestFunctionCallOutputItem):
            turns.append(Turn("tool", [item.output], tool_call_id=item.call_id))
    return turns


def _echoed_tool(tool: ResponsesRequestFunctionTool) -> dict[str, Any]:
    return {"type": "function", "name": tool.name, "description": tool.description,
            "parameters": tool.parameters, "strict": False}


def response_request(request: CreateResponse, *, context_limit: int) -> ResponseRequest:
    """The checks no schema says, then the shared chat conversion."""
    check_nulls(request)
    images: list[ImageRef] = []
    turns = _turns(request, images)
    # The offline web_search tool is dropped here: no search ever runs.
    functions = [t.root for t in request.tools if isinstance(t.root, ResponsesRequestFunctionTool)]
    tool_choice = str(request.tool_choice)
    echoed = [] if tool_choice == "none" else [_echoed_tool(t) for t in functions]
    options = sampling(temperature=request.temperature, top_p=request.top_p)
    max_tokens = None if request.max_output_tokens is None else int(request.max_output_tokens.root)
    chat = chat_request(turns, sampling=options, context_limit=context_limit, tool_choice=tool_choice,
                        tools=[function_tool(t.name, t.description, t.parameters) for t in functions],
                        max_tokens=max_tokens)
    return ResponseRequest(model=request.model, chat=chat, stream=request.stream,
                           instructions=request.instructions, tools=echoed, tool_choice=tool_choice,
                           parallel_tool_calls=request.parallel_tool_calls, temperature=options.temperature,
                           top_p=options.top_p, max_output_tokens=max_tokens, images=images)


# -- the handler -----------------------------------------------------------------------------------

@route(ROUTE_RULES)
async def create_response(call: Call, parsed: CreateResponse) -> Response | dict[str, Any]:
    request = response_request(parsed, context_limit=call.settings.context_limit)
    engine = call.engine
    model = engine.model_for(request.model, Task.GENERATE)
    await attach_images(engine, request.chat, request.images, model)
    events = engine.chat(model.id, request.chat)
    if request.stream:
        events = await start_stream(events)  # errors before the first token stay plain HTTP errors
        return StreamingResponse(_sse(request, events), media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
    collected = [event async for event in collect_or_cancel(call.request, events)]
    if not collected or not isinstance(collected[-1], Finished):
        raise Cancelled()
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
