"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the shared generator.

The generated models (specs/anthropic.yaml, from the pinned anthropic SDK's types) parse the request;
this module reads it into the turns chat and responses share, and adds what no schema says:
- tool_result blocks become tool turns, ahead of the rest of their user message;
- a final assistant message is a prefill: the answer continues it;
- thinking blocks of earlier turns go back to the template as `reasoning_content`;
- `thinking` maps onto the template's thinking switch and a budget of thinking tokens;
- `max_tokens` is held to the context window (the answer stops there with stop_reason max_tokens).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pydantic
from fastapi import Response
from fastapi.responses import StreamingResponse

from swama.engine.client import Cancelled, ChatRequest, NotFound, Task, TokenizeJob
from swama.generated.anthropic_models import AnthropicMessageCountTokensParams, AnthropicMessageCreateParams
from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.pipeline import Call, route
from swama.handlers.http.streaming import collect_or_cancel, event_stream, start_stream
from swama.handlers.media.images import ImageRef, valid_image_url
from swama.handlers.routes.messages_render import MessageStream, final_message, sse_frame
from swama.handlers.routes.messages_wording import COUNT_RULES, RULES, error_type
from swama.handlers.routes.turns import (
    OutputRules,
    Thinking,
    Turn,
    attach_images,
    chat_request,
    function_tool,
    image_refs,
    merge_adjacent_system,
    sampling,
    tool_call,
    unwrap,
)

SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive"}



def _plain(node: Any) -> Any:
    """A generated model (or a value holding some) as plain JSON data."""
    node = unwrap(node)
    if isinstance(node, pydantic.BaseModel):
        return node.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _blocks(content: Any) -> list[Any]:
    content = unwrap(content)
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    return [unwrap(b) for b in content]


def _kind(block: Any) -> str:
    return "text" if isinstance(block, str) else str(unwrap(block.type))


def _image(block: Any, where: str) -> ImageRef:
    source = unwrap(block.source)
    if str(unwrap(source.type)) == "base64":
        url = f"data:{unwrap(source.media_type)};base64,{source.data}"
    else:
        url = str(source.url)
    if not valid_image_url(url):
        raise bad_request(f"{where}.source: the image must be base64 data or an http(s) URL.", param=where)
    return ImageRef(where, url)


def _text(block: Any) -> str:
    return block if isinstance(block, str) else block.text


def _tool_result(block: Any, where: str) -> Turn:
    parts: list[str | ImageRef] = []
    for j, part in enumerate(_blocks(block.content)):
        kind = _kind(part)
        parts.append(_image(part, f"{where}.content.{j}") if kind == "image" else _text(part))
    if unwrap(getattr(block, "is_error", None)):
        # Chat templates have no error flag for a tool's result: the text says it.
        parts.insert(0, "Error:")
    return Turn("tool", parts, tool_call_id=block.tool_use_id)


def _message_turns(message: Any, i: int) -> list[Turn]:
    role = str(unwrap(message.role))
    where = f"messages.{i}.content"
    if role == "system":  # a system message among the turns: a system turn in its place
        return [Turn("system", ["\n".join(_text(b) for b in _blocks(message.content))])]
    turns: list[Turn] = []
    turn = Turn(role)
    thinking: list[str] = []
    for j, block in enumerate(_blocks(message.content)):
        kind = _kind(block)
        if kind == "text":
            turn.parts.append(_text(block))
        elif kind == "image":
            turn.parts.append(_image(block, f"{where}.{j}"))
        elif kind == "tool_use" and role == "assistant":
            turn.tool_calls.append(tool_call(block.id, block.name, _plain(block.input) or {}))
        elif kind == "tool_result" and role == "user":
            turns.append(_tool_result(block, f"{where}.{j}"))
        elif kind == "thinking" and role == "assistant":
            thinking.append(block.thinking)
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # nothing readable to give back
        else:
            raise bad_request(f"{where}.{j}: a '{kind}' block cannot appear in a {role} message.",
                              param=f"{where}.{j}")
    if thinking:
        turn.reasoning = "\n".join(thinking)
    if turn.parts or turn.tool_calls or not turns:
        turns.append(turn)
    return turns


def _system(system: Any) -> list[Turn]:
    texts = [_text(b) for b in _blocks(system)]
    return [Turn("system", ["\n".join(texts)])] if texts else []


def turns_from(system: Any, messages: list[Any]) -> list[Turn]:
    turns = _system(system)
    for i, message in enumerate(messages):
        turns += _message_turns(unwrap(message), i)
    return merge_adjacent_system(turns)


def tools_from(tools: Any) -> tuple[list[dict[str, Any]], frozenset[str]]:
    out, strict = [], set()
    for tool in unwrap(tools) or []:
        tool = unwrap(tool)
        schema = _plain(tool.input_schema)
        out.append(function_tool(tool.name, unwrap(getattr(tool, "description", None)), schema))
        if unwrap(getattr(tool, "strict", None)):
            strict.add(tool.name)
    return out, frozenset(strict)


def _output_config(request: Any) -> tuple[str | None, dict[str, Any] | None]:
    """output_config's effort and JSON schema, each None when not given."""
    config = unwrap(getattr(request, "output_config", None))
    if config is None:
        return None, None
    effort = unwrap(getattr(config, "effort", None))
    fmt = unwrap(getattr(config, "format", None))
    return (str(unwrap(effort)) if effort is not None else None,
            _plain(fmt.schema_) if fmt is not None else None)


def output_rules(request: Any, strict: frozenset[str]) -> OutputRules:
    choice = unwrap(request.tool_choice)
    kind = str(unwrap(choice.type)) if choice is not None else "auto"
    parallel = not unwrap(getattr(choice, "disable_parallel_tool_use", None)) if choice is not None else True
    mode = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}[kind]
    _, schema = _output_config(request)
    return OutputRules(format="json_schema" if schema is not None else "text", schema=schema, tool_choice=mode,
                       function=choice.name if kind == "tool" else None, strict=strict, parallel=parallel)


def thinking_from(request: Any) -> Thinking:
    """`thinking`: enabled (on, with its budget), adaptive or between_tools (the template's default, within
    output_config.effort's budget), or disabled; absent: as for adaptive."""
    config = unwrap(getattr(request, "thinking", None))
    effort, _ = _output_config(request)
    if config is None:
        return Thinking.from_effort(effort) if effort is not None else Thinking()
    kind = str(unwrap(config.type))
    if kind == "disabled":
        return Thinking(False)
    budget = unwrap(getattr(config, "budget_tokens", None))
    if budget is not None:  # enabled: thinking asked for, with its budget
        return Thinking(True, int(budget))
    # adaptive, between_tools: the model thinks as its template does, within output_config's effort
    return Thinking(None, Thinking.from_effort(effort).budget if effort is not None else None)


def request_from(request: Any, context_limit: int) -> tuple[ChatRequest, list[ImageRef]]:
    """A create (or count_tokens) request as the generator's ChatRequest; fields count_tokens lacks
    (max_tokens, stop_sequences, sampling) are read as absent."""
    turns = turns_from(getattr(request, "system", None), [unwrap(m) for m in unwrap(request.messages)])
    continue_final = bool(turns) and turns[-1].role == "assistant" and not turns[-1].tool_calls
    tools, strict = tools_from(getattr(request, "tools", None))
    options = sampling(temperature=unwrap(getattr(request, "temperature", None)),
                       top_p=unwrap(getattr(request, "top_p", None)), top_k=unwrap(getattr(request, "top_k", None)))
    stop = [str(s) for s in unwrap(getattr(request, "stop_sequences", None)) or []]
    # max_tokens is an upper bound: held to the context window, the answer stops there (max_tokens).
    asked = unwrap(getattr(request, "max_tokens", None))
    max_tokens = min(int(asked), context_limit) if asked is not None else None
    chat = chat_request(turns, sampling=options, context_limit=context_limit, tools=tools,
                        rules=output_rules(request, strict), params=("output_config", "tool_choice"),
                        max_tokens=max_tokens, stop=stop, thinking=thinking_from(request),
                        continue_final=continue_final, keep=marks_cache(request.model_dump(exclude_none=True)))
    return chat, image_refs(turns)


def marks_cache(value: Any) -> bool:
    """Whether a request sets `cache_control` anywhere (on itself, a system block, a message's block, a tool)."""
    if isinstance(value, dict):
        return "cache_control" in value or any(marks_cache(v) for v in value.values())
    return isinstance(value, list) and any(marks_cache(v) for v in value)


def _model(call: Call, name: str) -> Any:
    try:
        return call.engine.model_for(name, Task.GENERATE)
    except NotFound as exc:
        if name.startswith("claude"):
            raise ApiError(404, f"{exc.message} This server runs local models: point the client at one, e.g. "
                                "ANTHROPIC_MODEL=smollm2 for Claude Code.", code="model_not_found") from None
        raise


@route(RULES)
async def create_message(call: Call, parsed: AnthropicMessageCreateParams) -> Response | dict[str, Any]:
    request, images = request_from(parsed, call.settings.context_limit)
    name = str(unwrap(parsed.model))
    model = _model(call, name)
    await attach_images(call.engine, request, images, model, private_allowed=call.settings.allow_private_urls)
    events = call.engine.chat(model.id, request)
    if unwrap(getattr(parsed, "stream", None)):
        events = await start_stream(events)  # errors before the first token stay plain HTTP errors
        return StreamingResponse(_sse(name, events), media_type="text/event-stream", headers=SSE_HEADERS)
    collected = [event async for event in collect_or_cancel(call.request, events)]
    if not collected:
        raise Cancelled()
    try:
        return final_message(name, collected)
    except ValueError:
        raise Cancelled() from None


def _sse(model: str, events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    stream = MessageStream(model)
    return event_stream(events, stream.start, stream.feed,
                        lambda exc: stream.failed(error_type(exc.status), exc.message), sse_frame)


@route(COUNT_RULES)
async def count_message_tokens(call: Call, parsed: AnthropicMessageCountTokensParams) -> dict[str, Any]:
    """The prompt's tokens as /v1/messages would render it (tools and thinking switch included)."""
    request, images = request_from(parsed, call.settings.context_limit)
    name = str(unwrap(parsed.model))
    model = _model(call, name)
    await attach_images(call.engine, request, images, model, private_allowed=call.settings.allow_private_urls)
    switch = {"enable_thinking": request.thinking} if request.thinking is not None else {}
    job = TokenizeJob(messages=request.messages, tools=request.tools, images=request.images,
                      add_special_tokens=False, add_generation_prompt=not request.continue_final,
                      continue_final_message=request.continue_final, template_kwargs=switch)
    tokenized = await call.engine.tokenize(model.id, job)
    return {"input_tokens": len(tokenized.ids)}
