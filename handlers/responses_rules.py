"""`POST /v1/responses`: the rules no schema can say, and the typed request read into a ChatRequest.

The generated `CreateResponse` refuses unknown fields, wrong types, unsupported values and
out-of-range sampling itself (its errors are worded in responses_schema_errors). What stays here:
`model` before everything, explicit nulls, function-call arguments that must hold a JSON object,
image URLs, dropping the offline web_search tool, then the conversion shared with chat completions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swama.engine.text.generator import ChatRequest
from swama.generated.openai_models import (
    CreateResponse,
    ResponsesRequestFunctionCallItem,
    ResponsesRequestFunctionCallOutputItem,
    ResponsesRequestFunctionTool,
    ResponsesRequestImagePart,
    ResponsesRequestMessageItem,
)
from swama.handlers.chat_request import Turn, chat_request, function_tool, json_object, sampling, tool_call
from swama.handlers.dispatch import RouteRules
from swama.handlers.images import ImageRef, valid_image_url
from swama.handlers.responses_schema_errors import (
    bad_json,
    check_nulls,
    malformed,
    missing_model,
    not_object,
    schema_error,
    unsupported,
)

ROLES = {"user": "user", "developer": "system", "system": "system", "assistant": "assistant", "tool": "tool"}


def before_model(data: dict[str, Any]) -> None:
    # The route names a missing model before anything else, unknown fields included.
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise missing_model()
    # The generated models read 0 as `false` (Python's False == 0) where the schema allows only false.
    for name in ("store", "background"):
        if type(data.get(name, False)) in (int, float):
            raise malformed(f"`{name}` must be a JSON boolean")


# Every field the handler acts on or accepts with a local meaning; a field a spec change adds is
# refused until it is listed here.
FIELDS = frozenset({
    "model", "input", "instructions", "stream", "temperature", "top_p", "max_output_tokens", "tools",
    "tool_choice", "text", "truncation", "store", "background", "parallel_tool_calls", "client_metadata",
    "prompt_cache_key", "reasoning", "include",
})
ROUTE_RULES = RouteRules(bad_json=bad_json, not_object=not_object, before_model=before_model,
                         schema_error=schema_error, handled=FIELDS, unhandled=unsupported)


# -- the typed request, read into what the generator runs ------------------------------------------

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
