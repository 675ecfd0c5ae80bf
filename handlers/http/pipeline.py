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

import functools
import importlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from swama.engine.client import EngineClient, EngineError
from swama.handlers.http.errors import ApiError, bad_request, engine_error, error_body
from swama.handlers.http.schema_errors import openai_schema_error
from swama.handlers.http.settings import ServerSettings
from swama.handlers.http.strict_json import StrictJSONError, parse_strict_json

log = logging.getLogger("swama")

MiB = 1024 * 1024
# "100MB" for an uploaded audio file means 100,000,000 bytes of the file part; the body may add
# 64 KiB of multipart framing and other fields, so a larger declared body is refused unread.
TRANSCRIPTION_FILE_LIMIT = 100 * 1000 * 1000
# Route-specific body limits; everything else gets a generous default so a stray upload cannot
# exhaust memory.
BODY_LIMITS = {"/v1/systemone": 13 * MiB, "/v1/audio/transcriptions": TRANSCRIPTION_FILE_LIMIT + 64 * 1024}
DEFAULT_BODY_LIMIT = 64 * MiB
TOO_LARGE = {"/v1/systemone": "The request body is larger than 13 MiB.",
             "/v1/audio/transcriptions": "File size exceeds 100MB limit"}
# The Clef cards cap the whole request body at 13 MiB, as /v1/systemone does.
CLEF_RUN = "/ai/run/@cf/cloudflare/"


def _limit_key(path: str) -> str:
    return "/v1/systemone" if CLEF_RUN in path else path


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    family: str  # "openai" | "decisions" | "systemone" | "workers_ai": picks the error envelope
    handler: str
    media_type: str | None
    request_model: type[pydantic.BaseModel] | None
    response_model: type[pydantic.BaseModel] | None
    error_model: type[pydantic.BaseModel] | None

    @property
    def error_family(self) -> str:
        return self.family if self.family in ("decisions", "systemone", "workers_ai") else "openai"


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


async def _parse_form(op: Operation, rules: RouteRules, request: Request, body: bytes) -> pydantic.BaseModel:
    from starlette.requests import Request as StarletteRequest

    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request("Content-Type must be multipart/form-data", code="invalid_content_type")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await StarletteRequest(request.scope, receive).form(max_files=4, max_fields=64)
    except Exception as exc:  # python-multipart raises several unrelated types
        raise bad_request(f"Malformed request: the multipart body does not parse ({exc})",
                          code="invalid_multipart") from None
    assert op.request_model is not None
    kinds = _form_kinds(op.request_model)
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if not isinstance(value, str):
            fields[name] = await value.read()  # an upload: the model's `file` is binary
            continue
        key = name.removesuffix("[]")
        kind = kinds.get(key, set())
        if "array" in kind:
            fields.setdefault(key, []).append(value)
        else:
            fields[key] = _form_value(value, kind)
    return validate(op.request_model, rules, fields)


@functools.cache
def _form_kinds(model: type[pydantic.BaseModel]) -> dict[str, set[str]]:
    """The JSON types each field may take: form fields arrive as text and are typed from these."""

    schema = model.model_json_schema()
    defs = schema.get("$defs", {})

    def types(node: dict[str, Any]) -> set[str]:
        if "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
        found = {node["type"]} if isinstance(node.get("type"), str) else set()
        if "enum" in node or "const" in node:
            found.add("string")
        for key in ("anyOf", "oneOf", "allOf"):
            for member in node.get(key, []):
                found |= types(member)
        return found

    return {name: types(prop) for name, prop in schema["properties"].items()}


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", dict: "object", type(None): "null"}


def _form_value(text: str, kinds: set[str]) -> Any:
    """A form field's text as the JSON value it spells, when the field takes such a value (a number,
    a boolean, null or an object); otherwise the text itself, for the model to judge."""
    if not kinds - {"string"}:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    kind = _JSON_TYPES.get(type(value))
    if kind in kinds or (kind == "integer" and "number" in kinds):
        return value
    return text


def _decode(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "zstd":
        import zstandard

        try:
            # Bounded so a small compressed body cannot expand past the route's limit.
            return zstandard.ZstdDecompressor().decompress(body, max_output_size=DEFAULT_BODY_LIMIT + 1)
        except zstandard.ZstdError as exc:
            raise bad_request(f"Malformed request: the zstd body does not decode ({exc})",
                              code="invalid_encoding") from None
    if encoding == "gzip":
        import gzip
        import zlib

        try:
            return gzip.decompress(body)
        except (OSError, EOFError, zlib.error) as exc:
            raise bad_request(f"Malformed request: the gzip body does not decode ({exc})",
                              code="invalid_encoding") from None
    raise ApiError(415, f"Content-Encoding '{encoding}' is not supported; send zstd, gzip or no encoding.",
                   code="unsupported_encoding")


async def read_body(request: Request, path: str) -> bytes:
    path = _limit_key(path)
    limit = BODY_LIMITS.get(path, DEFAULT_BODY_LIMIT)
    too_large = ApiError(413, TOO_LARGE.get(path, f"The request body is larger than {limit // MiB} MiB."),
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    body = _decode(b"".join(chunks), request.headers.get("content-encoding", ""))
    if len(body) > limit:
        raise too_large
    return body


def _check_key(op: Operation, request: Request, settings: ServerSettings) -> None:
    if not settings.api_key or request.headers.get("authorization", "") == f"Bearer {settings.api_key}":
        return
    # System One names this error for what it is; the OpenAI API keeps invalid_request_error + a code.
    kind = "authentication_error" if op.family == "systemone" else None
    raise ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                   code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}, kind=kind)


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
        if op.method == "POST":
            call.body = await read_body(request, op.path)
            if op.media_type == "multipart/form-data":
                parsed = await _parse_form(op, rules, request, call.body)
            else:
                parsed = parse_json_request(op, rules, call.body)
        result = await handler(call, parsed)
    except ClientDisconnect:
        # The client went away before its body arrived: nobody is left to answer.
        log.info("client disconnected before sending the whole body of %s", op.operation_id)
        return Response(status_code=499)
    except ApiError as err:
        return error_response(op, err, call.extra_headers)
    except EngineError as exc:
        return error_response(op, engine_error(exc), call.extra_headers)
    except Exception:  # a bug or a backend failure: never leak a traceback, never a bare 500 page
        log.exception("unhandled error in %s", op.operation_id)
        return error_response(op, ApiError(500, "Internal server error.", code="server_error"), call.extra_headers)
    if isinstance(result, Response):
        result.headers.update(call.extra_headers)
        return result
    return JSONResponse(result, headers=call.extra_headers)

