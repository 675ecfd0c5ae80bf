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

from swama.engine.client import Cancelled, ChatRequest, Finished, Task
from swama.generated.openai_models import (
    CreateResponse,
    ResponsesRequestFunctionCallItem,
    ResponsesRequestFunctionCallOutputItem,
    ResponsesRequestFunctionChoice,
    ResponsesRequestFunctionTool,
    ResponsesRequestImagePart,
    ResponsesRequestMessageItem,
    ResponsesRequestTextFormatJsonSchema,
)
from swama.handlers.http.pipeline import Call, route
from swama.handlers.http.streaming import collect_or_cancel, event_stream, start_stream
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
    OutputRules,
    Thinking,
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
    tool_choice: str | dict[str, Any] = "auto"  # as echoed: a mode, or the function it forces
    parallel_tool_calls: bool = True
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})  # as echoed
    top_logprobs: int | None = None
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
        # Reasoning items of earlier turns are not shown to the model (see the overlay).
    return turns


def _echoed_tool(tool: ResponsesRequestFunctionTool) -> dict[str, Any]:
    return {"type": "function", "name": tool.name, "description": tool.description,
            "parameters": tool.parameters, "strict": bool(tool.strict)}


def _text_format(request: CreateResponse) -> Any:
    """The requested text.format member (text, json_object, json_schema), or None."""
    return request.text.format.root if request.text is not None and request.text.format is not None else None


def _output_rules(request: CreateResponse, functions: list[ResponsesRequestFunctionTool], fmt: Any) -> OutputRules:
    """text.format, tool_choice, strict functions, parallel_tool_calls and the logprobs include."""
    choice = request.tool_choice
    named = choice.name if isinstance(choice, ResponsesRequestFunctionChoice) else None
    logprobs = "message.output_text.logprobs" in {str(i) for i in request.include}
    return OutputRules(
        format=str(fmt.type) if fmt is not None else "text",
        schema=fmt.schema_ if isinstance(fmt, ResponsesRequestTextFormatJsonSchema) else None,
        tool_choice="function" if named else str(choice or "auto"), function=named,
        strict=frozenset(t.name for t in functions if t.strict), parallel=request.parallel_tool_calls,
        logprobs=(request.top_logprobs or 0) if logprobs else None)


def response_request(request: CreateResponse, *, context_limit: int) -> ResponseRequest:
    """The checks no schema says, then the shared chat conversion."""
    check_nulls(request)
    images: list[ImageRef] = []
    turns = _turns(request, images)
    # The offline web_search tool is dropped here: no search ever runs.
    functions = [t.root for t in request.tools if isinstance(t.root, ResponsesRequestFunctionTool)]
    fmt = _text_format(request)
    rules = _output_rules(request, functions, fmt)
    echoed = [] if rules.tool_choice == "none" else [_echoed_tool(t) for t in functions]
    options = sampling(temperature=request.temperature, top_p=request.top_p)
    max_tokens = None if request.max_output_tokens is None else int(request.max_output_tokens.root)
    effort = request.reasoning.effort if request.reasoning is not None else None
    chat = chat_request(turns, sampling=options, context_limit=context_limit, rules=rules, params=(None, None),
                        tools=[function_tool(t.name, t.description, t.parameters) for t in functions],
                        max_tokens=max_tokens, thinking=Thinking.from_effort(str(effort) if effort else None),
                        keep=bool(request.prompt_cache_key))
    choice = request.tool_choice
    return ResponseRequest(model=request.model, chat=chat, stream=request.stream,
                           instructions=request.instructions, tools=echoed,
                           tool_choice=(choice.model_dump() if isinstance(choice, ResponsesRequestFunctionChoice)
                                        else str(choice or "auto")),
                           parallel_tool_calls=request.parallel_tool_calls, temperature=options.temperature,
                           top_p=options.top_p, max_output_tokens=max_tokens, images=images,
                           text_format=fmt.model_dump(by_alias=True, exclude_none=True) if fmt is not None
                           else {"type": "text"},
                           top_logprobs=request.top_logprobs)


# -- the handler -----------------------------------------------------------------------------------

@route(ROUTE_RULES)
async def create_response(call: Call, parsed: CreateResponse) -> Response | dict[str, Any]:
    request = response_request(parsed, context_limit=call.settings.context_limit)
    engine = call.engine
    model = engine.model_for(request.model, Task.GENERATE)
    await attach_images(engine, request.chat, request.images, model, private_allowed=call.settings.allow_private_urls)
    events = engine.chat(model.id, request.chat)
    if request.stream:
        events = await start_stream(events)  # errors before the first token stay plain HTTP errors
        return StreamingResponse(_sse(request, events), media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)
    collected = [event async for event in collect_or_cancel(call.request, events)]
    if not collected or not isinstance(collected[-1], Finished):
        raise Cancelled()
    return final_response(request, collected)


def _sse(request: ResponseRequest, events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    stream = ResponseStream(request)
    return event_stream(events, stream.start, stream.feed, lambda exc: stream.failed(exc.message), sse_frame)
