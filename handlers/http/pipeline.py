"""The request pipeline every generated route stub takes, in one order for every operation:

1. raw checks: API key, body size, content encoding, strict JSON (duplicate keys, depth,
   NaN/Infinity, lone surrogates) or multipart;
2. the route's seed rules that must win over schema errors (check order), on the decoded JSON;
3. the operation's generated strict request model (unknown fields, types, enums, required fields,
   ranges the spec states), its errors worded by the route's mapper;
4. fields the model accepts but the handler does not act on are refused, never ignored;
5. the handler, which receives the typed model and adds only what no schema can say.

A handler is `async def handler(call: Call, request: Model | None) -> Response | dict`, named in the
spec by `x-swama-handler: "module:function"` (resolved under swama.handlers) and decorated with
`@route(RouteRules(...))` to bring its wording.
"""

from __future__ import annotations

import hmac
import importlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from swama.engine.client import EngineClient, EngineError, out_of_memory
from swama.handlers.http.body import read_body
from swama.handlers.http.errors import ApiError, bad_request, engine_error, error_body
from swama.handlers.http.forms import read_form
from swama.handlers.http.schema_errors import openai_schema_error
from swama.handlers.http.settings import ServerSettings
from swama.handlers.http.strict_json import StrictJSONError, parse_strict_json

log = logging.getLogger("swama")
# Bodies up to this size are parsed on the event loop (well under a millisecond); larger ones in
# Starlette's bounded thread pool, so a 13 MiB body does not hold /health for the time it takes.
INLINE_JSON_BYTES = 64 * 1024

@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    family: str  # "openai" | "decisions" | "systemone" | "workers_ai" | "anthropic" | "cohere": the error envelope
    handler: str
    media_type: str | None
    request_model: type[pydantic.BaseModel] | None
    response_model: type[pydantic.BaseModel] | None
    error_model: type[pydantic.BaseModel] | None

    @property
    def error_family(self) -> str:
        return self.family if self.family in ("decisions", "systemone", "workers_ai", "anthropic", "cohere") else "openai"


def _malformed_json(error: StrictJSONError | None) -> ApiError:
    if error is None:
        return bad_request("Malformed request: empty body", code="invalid_json")
    return bad_request(f"Malformed request: invalid JSON ({error})", code="invalid_json")


def _not_object(_: Any) -> ApiError:
    return bad_request("Malformed request: top-level JSON must be an object", code="invalid_json")


def _no_rules(_: dict[str, Any]) -> None:
    return None


def _unhandled(name: str) -> ApiError:
    return bad_request(f"'{name}' is not supported by this server; it is rejected rather than ignored.",
                       code="unsupported_parameter", param=name)


@dataclass(frozen=True)
class RouteRules:
    """What a route adds around its generated request model; the defaults are the OpenAI wording."""

    # A body that is not strict JSON (None: an empty body).
    bad_json: Callable[[StrictJSONError | None], ApiError] = _malformed_json
    not_object: Callable[[Any], ApiError] = _not_object
    # Seed rules whose message must win over any schema error; they read the decoded JSON.
    before_model: Callable[[dict[str, Any]], None] = _no_rules
    schema_error: Callable[[pydantic.ValidationError, Any], ApiError] = openai_schema_error
    # Top-level fields the handler acts on; any other field the model accepts is refused by
    # `unhandled`, so a field a spec bump adds is never silently ignored. None: the handler takes all.
    handled: frozenset[str] | None = None
    unhandled: Callable[[str], ApiError] = _unhandled


DEFAULT_RULES = RouteRules()

Handler = Callable[["Call", Any], Awaitable[Any]]


def route(rules: RouteRules = DEFAULT_RULES) -> Callable[[Handler], Handler]:
    """Attach a route's rules to its handler."""

    def attach(handler: Handler) -> Handler:
        handler.rules = rules  # type: ignore[attr-defined]
        return handler

    return attach


@dataclass
class Call:
    """One request on its way to a handler."""

    op: Operation
    request: Request
    settings: ServerSettings
    body: bytes = b""
    extra_headers: dict[str, str] = field(default_factory=dict)

    @property
    def engine(self) -> EngineClient:
        return self.request.app.state.engine


def parse_json_request(op: Operation, rules: RouteRules, body: bytes) -> pydantic.BaseModel:
    """Steps 2-4 on a JSON body: decode strictly, the route's first rules, the generated model."""
    assert op.request_model is not None
    if not body.strip():
        raise rules.bad_json(None)
    try:
        data = parse_strict_json(body)
    except StrictJSONError as exc:
        raise rules.bad_json(exc) from None
    if not isinstance(data, dict):
        raise rules.not_object(data)
    rules.before_model(data)
    return validate(op.request_model, rules, data)


def validate(model: type[pydantic.BaseModel], rules: RouteRules, data: Any) -> pydantic.BaseModel:
    try:
        parsed = model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise rules.schema_error(exc, data) from None
    if rules.handled is not None:
        for name in sorted(parsed.model_fields_set - rules.handled):
            if getattr(parsed, name) is not None:
                raise rules.unhandled(name)
    return parsed


def _same_secret(given: str, expected: str) -> bool:
    """Compared in constant time: how long a wrong key took to refuse says nothing of the right one."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def key_given(request: Request, settings: ServerSettings) -> bool:
    """Whether the request may pass the API key check: no key is set, or it sends the key as a bearer token."""
    return not settings.api_key or _same_secret(request.headers.get("authorization", ""), f"Bearer {settings.api_key}")


def _check_key(op: Operation, request: Request, settings: ServerSettings) -> None:
    if key_given(request, settings):
        return
    if op.family == "anthropic":
        # Anthropic's clients send the key as x-api-key; a bearer token is taken as on every route.
        if _same_secret(request.headers.get("x-api-key", ""), settings.api_key):
            return
        raise ApiError(401, "Missing or wrong API key: send 'x-api-key: <key>' or 'Authorization: Bearer <key>'.",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}, kind="authentication_error")
    # System One names this error for what it is; the OpenAI API keeps invalid_request_error + a code.
    kind = "authentication_error" if op.family == "systemone" else None
    raise ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                   code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}, kind=kind)


def _check_media_type(op: Operation, request: Request) -> None:
    """A route reads only a body labelled with its own media type: a browser sends text/plain (or no
    type) across origins without asking first, so a JSON route refuses any other type unread."""
    expected = op.media_type or "application/json"
    given = request.headers.get("content-type", "")
    if given.split(";", 1)[0].strip().lower() != expected:
        named = f"got {given!r}" if given else "the request named no type"
        raise ApiError(415, f"{op.method} {op.path} reads only {expected} bodies: send 'Content-Type: {expected}' "
                            f"({named}).", code="unsupported_media_type")


def error_response(op: Operation, err: ApiError, extra_headers: dict[str, str] | None = None) -> JSONResponse:
    headers = {**(extra_headers or {}), **(err.headers or {})}
    return JSONResponse(error_body(op.error_family, err), status_code=err.status, headers=headers)


_handlers: dict[str, Handler] = {}


def resolve(name: str) -> Handler:
    if name not in _handlers:
        module, func = name.split(":")
        _handlers[name] = getattr(importlib.import_module(f"swama.handlers.{module}"), func)
    return _handlers[name]


def rules_of(handler: Handler) -> RouteRules:
    return getattr(handler, "rules", DEFAULT_RULES)


async def dispatch(op: Operation, request: Request) -> Response:
    settings: ServerSettings = request.app.state.settings
    call = Call(op, request, settings)
    if op.family == "systemone":
        call.extra_headers["x-typesafe-request-id"] = f"systemone-{uuid.uuid4()}"
    try:
        _check_key(op, request, settings)
        handler = resolve(op.handler)
        rules = rules_of(handler)
        parsed: pydantic.BaseModel | None = None
        if op.method == "POST" and op.request_model is not None:  # a POST with no body to read: a cancel
            _check_media_type(op, request)
            call.body = await read_body(request, op.path)
            if op.media_type == "multipart/form-data":
                assert op.request_model is not None
                parsed = validate(op.request_model, rules, await read_form(request, call.body, op.request_model))
            elif len(call.body) <= INLINE_JSON_BYTES:
                parsed = parse_json_request(op, rules, call.body)
            else:  # a large body's parse and checks take milliseconds: off the event loop
                parsed = await run_in_threadpool(parse_json_request, op, rules, call.body)
        result = await handler(call, parsed)
    except ClientDisconnect:
        # The client went away before its body arrived: nobody is left to answer.
        log.info("client disconnected before sending the whole body of %s", op.operation_id)
        return Response(status_code=499)
    except ApiError as err:
        return error_response(op, err, call.extra_headers)
    except EngineError as exc:
        return error_response(op, engine_error(out_of_memory(exc) or exc), call.extra_headers)
    except Exception as exc:  # a bug or a backend failure: never leak a traceback, never a bare 500 page
        if (oom := out_of_memory(exc)) is not None:
            log.warning("%s ran out of memory: %s", op.operation_id, exc)
            return error_response(op, engine_error(oom), call.extra_headers)
        log.exception("unhandled error in %s", op.operation_id)
        return error_response(op, ApiError(500, "Internal server error.", code="server_error"), call.extra_headers)
    if isinstance(result, Response):
        result.headers.update(call.extra_headers)
        return result
    return JSONResponse(result, headers=call.extra_headers)

