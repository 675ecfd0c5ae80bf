"""POST /v1/chat/completions: the route's own wording for what its generated model refuses.

Fields the route does not act on are refused by name; sampling ranges get the engine's wording;
everything else falls back to the OpenAI default (http/schema_errors)."""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic_core import ErrorDetails

from swama.engine.client import OUT_OF_RANGE
from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.pipeline import DEFAULT_RULES, RouteRules
from swama.handlers.http.schema_errors import user_path, worded_or_default

CHAT_ROLES = "Must be 'system', 'user', 'assistant', or 'tool'"
# Fields the schema narrows to the one value this server honours: any other value is refused by name.
SINGLE_VALUED = frozenset({"n", "modalities"})
# Ranges of the swama extensions and token counts: the engine's wording (Sampling.check).
ENGINE_RANGES = frozenset({"top_k", "min_p", "repetition_penalty", "repetition_context_size", "max_tokens",
                           "max_completion_tokens"})
EXTENSION_TYPES = frozenset({"top_k", "min_p", "repetition_penalty", "repetition_context_size"})
RANGE_ERRORS = frozenset({"greater_than_equal", "less_than_equal"})


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
    return worded_or_default(exc, data, _worded)


# Every field the handler acts on, or accepts with a stated local meaning (see the overlay); a field
# a spec change adds to the model is refused until it is listed here.
HANDLED = frozenset({
    "model", "messages", "stream", "temperature", "top_p", "max_tokens", "max_completion_tokens",
    "presence_penalty", "frequency_penalty", "seed", "stop", "tools", "tool_choice", "n", "logprobs", "top_logprobs",
    "modalities", "response_format", "top_k", "min_p", "repetition_penalty", "repetition_context_size",
    "context_limit", "stream_options", "parallel_tool_calls", "store", "user", "safety_identifier",
    "prompt_cache_key", "metadata", "reasoning_effort", "chat_template_kwargs",
})
RULES = RouteRules(schema_error=schema_error, handled=HANDLED)
