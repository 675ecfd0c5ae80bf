"""POST /v1/chat/completions: OpenAI chat completions over the shared generator.

The typed request is read into the generator's `ChatRequest` through the turns chat and responses
share; chat_wording words its refusals, chat_render shapes the completion and its chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Response
from fastapi.responses import StreamingResponse

from swama.engine.client import (
    Cancelled,
    ChatRequest,
    Finished,
    Logprobs,
    ReasoningDelta,
    Task,
    TextDelta,
    ToolCallEvent,
)
from swama.generated.openai_models import (
    ChatCompletionNamedToolChoice,
    ChatCompletionTool,
    CreateChatCompletionRequest,
    ResponseFormatJsonSchema,
)
from swama.handlers.http.errors import bad_request
from swama.handlers.http.pipeline import Call, route
from swama.handlers.http.streaming import collect_or_cancel, start_stream
from swama.handlers.media.images import ImageRef, valid_image_url
from swama.handlers.routes.chat_render import chunks, completion
from swama.handlers.routes.chat_wording import CHAT_ROLES, RULES
from swama.handlers.routes.turns import (
    OutputRules,
    Thinking,
    Turn,
    attach_images,
    chat_request,
    function_tool,
    image_refs,
    json_object,
    sampling,
    tool_call,
    unwrap,
)


def _parts(content: Any, where: str) -> list[str | ImageRef]:
    content = unwrap(content)
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    parts: list[str | ImageRef] = []
    for j, part in enumerate(unwrap(p) for p in content):
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
    for k, entry in enumerate(unwrap(message.tool_calls) or []):
        call = unwrap(entry)  # a function call: the schema takes no other kind
        arguments = json_object(call.function.arguments)
        if arguments is None:
            raise bad_request(f"Tool '{call.function.name}' requires JSON object arguments or parameters",
                              param=f"{where}.tool_calls.{k}")
        calls.append(tool_call(call.id, call.function.name, arguments))
    return calls


def turns_from(messages: list[Any]) -> list[Turn]:
    turns = []
    for i, entry in enumerate(messages):
        message = unwrap(entry)
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
    stop = unwrap(request.stop)
    stop = [stop] if isinstance(stop, str) else list(unwrap(stop) or [])
    max_tokens = unwrap(request.max_completion_tokens)
    if max_tokens is None:
        max_tokens = unwrap(request.max_tokens)
    options = sampling(
        temperature=unwrap(request.temperature), top_p=unwrap(request.top_p), top_k=request.top_k,
        min_p=request.min_p, repetition_penalty=unwrap(request.repetition_penalty),
        repetition_context_size=request.repetition_context_size,
        presence_penalty=unwrap(request.presence_penalty), frequency_penalty=unwrap(request.frequency_penalty),
        seed=request.seed)
    turns = turns_from(request.messages)
    effort = unwrap(unwrap(request.reasoning_effort))
    kwargs = request.chat_template_kwargs
    thinking = Thinking.from_effort(str(effort) if effort is not None else None,
                                    kwargs.enable_thinking if kwargs is not None else None)
    chat = chat_request(turns, sampling=options, max_tokens=max_tokens, stop=stop,
                        tools=tools_from(request.tools), rules=output_rules(request),
                        context_limit=_context_limit(request.context_limit, context_limit), thinking=thinking,
                        keep=bool(request.prompt_cache_key))
    return chat, image_refs(turns)


def _context_limit(asked: int | None, server: int) -> int:
    """A request may narrow the server's context window (--context-limit), never widen it."""
    if asked is not None and asked > server:
        raise bad_request(f"'context_limit' may be at most the server's context limit of {server} tokens "
                          f"(--context-limit); got {asked}.", code="context_limit_exceeded", param="context_limit")
    return asked or server


def output_rules(request: CreateChatCompletionRequest) -> OutputRules:
    """response_format, tool_choice, strict functions, parallel_tool_calls and logprobs."""
    choice = unwrap(request.tool_choice)
    named = choice.function.name if isinstance(choice, ChatCompletionNamedToolChoice) else None
    fmt = unwrap(request.response_format)
    kind = str(fmt.type) if fmt is not None else "text"
    schema = None
    if isinstance(fmt, ResponseFormatJsonSchema):
        body = fmt.json_schema.schema_
        schema = body.model_dump(by_alias=True) if body is not None else {}
    top = unwrap(request.top_logprobs)
    if top is not None and not request.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true.", param="top_logprobs")
    strict = frozenset(t.function.name for t in request.tools or [] if t.function.strict)
    return OutputRules(format=kind, schema=schema,
                       tool_choice="function" if named else str(choice or "auto"), function=named,
                       strict=strict, parallel=request.parallel_tool_calls is not False,
                       logprobs=(top or 0) if request.logprobs else None)


@route(RULES)
async def create_chat_completion(call: Call, parsed: CreateChatCompletionRequest) -> Response | dict[str, Any]:
    engine = call.engine
    request, images = request_from(parsed, call.settings.context_limit)
    model = str(unwrap(parsed.model))
    installed = engine.model_for(model, Task.GENERATE)
    await attach_images(engine, request, images, installed, private_allowed=call.settings.allow_private_urls)
    ident, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())
    events = engine.chat(installed.id, request)
    if parsed.stream:
        # Errors found before the first token (context limit, template) still get a plain 4xx.
        events = await start_stream(events)
        return StreamingResponse(chunks(events, ident, created, model), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    text, thought, calls, done, logprobs = [], [], [], None, []
    async for event in collect_or_cancel(call.request, events):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, ReasoningDelta):
            thought.append(event.text)
        elif isinstance(event, Logprobs):
            logprobs += event.entries
        elif isinstance(event, ToolCallEvent):
            calls.append(event.call)
        elif isinstance(event, Finished):
            done = event
    if done is None:
        raise Cancelled()
    return completion(ident, created, model, "".join(text), calls, done,
                      logprobs if request.logprobs is not None else None, "".join(thought) or None)
