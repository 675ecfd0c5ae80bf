"""POST /v1/completions: the route's own wording for what its generated model and its handler refuse.

Fields the route does not serve (`suffix`, a non-empty `logit_bias`) are refused by name; the
handler-only rules' messages are listed in the overlay's `x-swama-handler-rules` under
createCompletion, so keep the two in step."""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic_core import ErrorDetails

from swama.engine.client import OUT_OF_RANGE
from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.pipeline import DEFAULT_RULES, RouteRules
from swama.handlers.http.schema_errors import user_path, worded_or_default

# OpenAI caps `logprobs` at 5; this server returns up to 20 alternatives, as chat's top_logprobs does.
MAX_LOGPROBS = 20
# OpenAI's documented default for `max_tokens` on this route (chat has none).
DEFAULT_MAX_TOKENS = 16
# Fields the schema allows only in the form that means "what the server does anyway".
NARROWED = frozenset({"logit_bias"})
RANGE_ERRORS = frozenset({"greater_than_equal", "less_than_equal", "greater_than", "less_than"})


def zero_tokens_need_echo() -> ApiError:
    return bad_request("'max_tokens' must be at least 1 unless 'echo' is true (0 scores the prompt alone).",
                       code="invalid_value", param="max_tokens")


def best_of_differs(best_of: int, n: int) -> ApiError:
    return bad_request(f"'best_of' must equal 'n' ({n}) on this server (got {best_of}): every completion "
                       "generated is returned, none is picked by its log probability.",
                       code="unsupported_value", param="best_of")


def _worded(error: ErrorDetails, data: Any) -> ApiError | None:
    path = user_path(error["loc"], data)
    top, kind = path[0] if path else None, error["type"]
    if (kind == "extra_forbidden" and len(path) == 1) or (top in NARROWED and len(path) <= 2):
        return DEFAULT_RULES.unhandled(str(top))
    if top == "prompt" and len(path) <= 3 and kind != "missing":
        return bad_request("'prompt' must be a non-empty string, a list of non-empty strings, a list of token ids "
                           "or a list of non-empty lists of token ids.", code="invalid_type", param="prompt")
    if top == "logprobs" and kind in RANGE_ERRORS:
        return bad_request(f"'logprobs' must be between 0 and {MAX_LOGPROBS} on this server (OpenAI allows up "
                           "to 5).", code="invalid_value", param="logprobs")
    if top == "max_tokens" and kind in RANGE_ERRORS:
        return ApiError(400, OUT_OF_RANGE, code="invalid_request", param="max_tokens")
    return None


def schema_error(exc: pydantic.ValidationError, data: Any = None) -> ApiError:
    """The route's own wording where it has one (refused fields first), else the OpenAI default."""
    return worded_or_default(exc, data, _worded)


# Every field the handler acts on, or accepts with a stated local meaning (see the overlay).
HANDLED = frozenset({
    "model", "prompt", "max_tokens", "temperature", "top_p", "stop", "n", "best_of", "seed", "stream",
    "stream_options", "presence_penalty", "frequency_penalty", "logprobs", "echo", "user", "logit_bias",
})
RULES = RouteRules(schema_error=schema_error, handled=HANDLED)
