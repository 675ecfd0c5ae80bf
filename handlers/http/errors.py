"""Errors and the error envelope each route family documents: the one place where a refusal, the
handlers' own (`ApiError`) or any of the engine's (`engine_error`), becomes a response body.

- OpenAI routes:  {"error": {"message", "type", "param", "code"}}
- /v1/decisions:  {"error": {"message", "type"}}
- /v1/systemone:  {"error": {"message", "type"}, "detail": {"error_type", "message"}}
  (the seed's envelope, plus System One's own so clients written for either read the message)
- Workers AI (Clef): {"result": null, "success": false, "errors": [{"code", "message"}], "messages": []}
  (Cloudflare's v4 envelope; `code` is Cloudflare's number for the kind of refusal)
- Anthropic (/v1/messages and below): {"type": "error", "error": {"type", "message"}}
  (Anthropic's envelope; `type` is Anthropic's name for the status, unless the refusal names its kind)
- Cohere (/v1/rerank, /v2/rerank): {"message"} (Cohere's; the status says the kind)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swama.engine.client import EngineError


@dataclass
class ApiError(Exception):
    status: int
    message: str
    code: str | None = None  # OpenAI routes only: a short machine-readable code
    param: str | None = None  # OpenAI routes only: the offending field
    headers: dict[str, str] | None = None
    kind: str | None = None  # overrides the error type derived from the status

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def type(self) -> str:
        if self.kind is not None:
            return self.kind
        return "invalid_request_error" if self.status < 500 else "server_error"


def engine_error(exc: EngineError) -> ApiError:
    """Any engine error as the HTTP refusal its class stands for."""
    param = "model" if exc.code == "model_not_found" else exc.param
    return ApiError(exc.status, exc.message, code=exc.code, param=param, headers=exc.headers)


def bad_request(message: str, *, code: str = "invalid_value", param: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=param)


def not_found(message: str = "The model is not available locally.", *, param: str | None = "model") -> ApiError:
    return ApiError(404, message, code="model_not_found", param=param)


# Cloudflare's API error numbers for the refusals these routes make.
CLOUDFLARE_CODES = {"invalid_api_key": 10000, "model_not_found": 5007, "not_found": 7000,
                    "method_not_allowed": 7001, "request_too_large": 3006}
CLOUDFLARE_BAD_INPUT, CLOUDFLARE_INTERNAL = 5006, 3043


def cloudflare_code(err: ApiError) -> int:
    if err.code in CLOUDFLARE_CODES:
        return CLOUDFLARE_CODES[err.code]
    return CLOUDFLARE_INTERNAL if err.status >= 500 else CLOUDFLARE_BAD_INPUT


# Anthropic's error type for each status it documents; other 4xx are invalid requests, other 5xx api_error.
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                         503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error_type(err: ApiError) -> str:
    if err.kind is not None:
        return err.kind
    return ANTHROPIC_ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")


def error_body(family: str, err: ApiError) -> dict[str, Any]:
    if family == "cohere":
        return {"message": err.message}
    if family == "anthropic":
        return {"type": "error", "error": {"type": anthropic_error_type(err), "message": err.message}}
    if family == "workers_ai":
        return {"result": None, "success": False,
                "errors": [{"code": cloudflare_code(err), "message": err.message}], "messages": []}
    if family == "decisions":
        return {"error": {"message": err.message, "type": err.type}}
    if family == "systemone":
        return {"error": {"message": err.message, "type": err.type},
                "detail": {"error_type": err.type, "message": err.message}}
    return {"error": {"message": err.message, "type": err.type, "param": err.param,
                      "code": err.code or ("server_error" if err.status >= 500 else "invalid_request")}}
