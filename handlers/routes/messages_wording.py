"""POST /v1/messages and /v1/messages/count_tokens: what the route acts on, and its error wording.

Refusals answer in Anthropic's envelope (http/errors.py, family "anthropic"); the messages are the
OpenAI routes' wording of the same schema errors, which name the field."""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic_core import ErrorDetails

from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.pipeline import RouteRules
from swama.handlers.http.schema_errors import user_path, worded_or_default

# Anthropic's error types by HTTP status (its documented status codes); others by their class.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error",
               503: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def _worded(error: ErrorDetails, data: Any) -> ApiError | None:
    path = user_path(error["loc"], data)
    kind = error["type"]
    if len(path) == 4 and path[0] == "messages" and path[2] == "content" and kind in (
            "union_tag_invalid", "union_tag_not_found"):
        block = data["messages"][path[1]]["content"][path[3]]
        found = block.get("type") if isinstance(block, dict) else None
        return bad_request(f"messages.{path[1]}.content.{path[3]}: content block type '{found}' is not supported "
                           "by this server.", code="unsupported_content", param=f"messages.{path[1]}.content.{path[3]}")
    tool = data["tools"][path[1]] if len(path) >= 2 and path[0] == "tools" and isinstance(path[1], int) else None
    found = tool.get("type") if isinstance(tool, dict) else None
    if found not in (None, "custom") and isinstance(found, str):  # a server tool (web search, bash, ...)
        return bad_request(f"tools.{path[1]}: tool type '{found}' is not supported by this server; only custom "
                           "tools (name, description, input_schema) are.", code="unsupported_value",
                           param=f"tools.{path[1]}")
    return None


def schema_error(exc: pydantic.ValidationError, data: Any = None) -> ApiError:
    return worded_or_default(exc, data, _worded)


def _unhandled(name: str) -> ApiError:
    return bad_request(f"'{name}' is not supported by this server; it is rejected rather than ignored.",
                       code="unsupported_parameter", param=name)


# Every field the handler acts on, or accepts with a stated local meaning (see the overlay): cache_control
# (the prompt cache applies to every request), metadata (not used), service_tier (one tier here),
# context_management (earlier thinking is kept, the one edit served).
HANDLED = frozenset({
    "model", "messages", "max_tokens", "system", "stream", "stop_sequences", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "thinking", "metadata", "cache_control", "service_tier", "output_config",
    "context_management",
})
COUNT_HANDLED = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control",
                           "output_config"})
RULES = RouteRules(schema_error=schema_error, handled=HANDLED, unhandled=_unhandled)
COUNT_RULES = RouteRules(schema_error=schema_error, handled=COUNT_HANDLED, unhandled=_unhandled)
