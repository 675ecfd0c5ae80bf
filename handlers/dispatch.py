"""The one path every generated route stub takes: read the body, call the handler, shape errors.

A handler is `async def handler(call: Call) -> Response | dict`, named in the spec by
`x-swama-handler: "module:function"` and resolved under swama.handlers.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pydantic
from fastapi import Request, Response
from fastapi.responses import JSONResponse

from swama.engine.errors import EngineError
from swama.engine.scorer import DecisionError
from swama.handlers.errors import ApiError, bad_request, error_body
from swama.handlers.settings import Settings

log = logging.getLogger("swama")
T = TypeVar("T")

MiB = 1024 * 1024
# Route-specific body limits; everything else gets a generous default so a stray upload cannot
# exhaust memory.
BODY_LIMITS = {"/v1/systemone": 13 * MiB, "/v1/audio/transcriptions": 101 * MiB}
DEFAULT_BODY_LIMIT = 64 * MiB
TOO_LARGE = {"/v1/systemone": "The request body is larger than 13 MiB.",
             "/v1/audio/transcriptions": "File size exceeds 100MB limit"}


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    family: str  # "openai" | "decisions" | "systemone": picks the error envelope
    handler: str
    media_type: str | None
    request_model: type[pydantic.BaseModel] | None
    response_model: type[pydantic.BaseModel] | None
    error_model: type[pydantic.BaseModel] | None

    @property
    def error_family(self) -> str:
        return self.family if self.family in ("decisions", "systemone") else "openai"


@dataclass
class Call:
    """One request on its way to a handler."""

    op: Operation
    request: Request
    settings: Settings
    body: bytes = b""
    extra_headers: dict[str, str] = field(default_factory=dict)

    @property
    def engine(self) -> Any:
        return self.request.app.state.engine

    def json(self, *, parse: Callable[[bytes], Any] | None = None) -> Any:
        """The body as JSON: NaN/Infinity refused; `parse` lets a route bring a stricter parser."""
        if not self.body.strip():
            raise bad_request("Malformed request: empty body", code="invalid_json")
        try:
            return (parse or parse_json)(self.body)
        except ApiError:
            raise
        except (ValueError, RecursionError) as exc:
            raise bad_request(f"Malformed request: invalid JSON ({exc})", code="invalid_json") from None

    async def form(self) -> dict[str, Any]:
        """The body as multipart form fields (uploads as starlette UploadFile); 400 when malformed."""
        from starlette.requests import Request as StarletteRequest

        body = self.body

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        replay = StarletteRequest(self.request.scope, receive)
        try:
            form = await replay.form(max_files=4, max_fields=64)
        except Exception as exc:  # python-multipart raises several unrelated types
            raise bad_request(f"Malformed request: the multipart body does not parse ({exc})",
                              code="invalid_multipart") from None
        return dict(form.multi_items())

    def validate(self, data: Any) -> pydantic.BaseModel:
        """Check `data` against the operation's generated request model; 400 on the first problem."""
        assert self.op.request_model is not None
        try:
            return self.op.request_model.model_validate(data)
        except pydantic.ValidationError as exc:
            raise validation_error(exc, data) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(body: bytes) -> Any:
    return json.loads(body, parse_constant=_refuse_constant)


def _user_path(loc: tuple[Any, ...], data: Any) -> list[str]:
    """The error location as the user wrote it: pydantic adds union-member and tag names to it."""
    path: list[str] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and (part in _TAGS or "[" in part or
                                        (isinstance(node, dict) and part in _string_values(node))):
            continue  # a union member or discriminator tag, not a field
        else:
            path.append(str(part))  # a missing or unknown field: nothing to descend into
            break
        path.append(str(part))
    return path


def _string_values(node: dict[str, Any]) -> set[str]:
    return {v for v in node.values() if isinstance(v, str)}


def validation_error(exc: pydantic.ValidationError, data: Any = None) -> ApiError:
    first = exc.errors(include_url=False)[0]
    param = ".".join(_user_path(first["loc"], data)) or None
    where = f" at '{param}'" if param else ""
    kind = first["type"]
    if kind == "extra_forbidden":
        return bad_request(f"Unknown field '{param}'.", code="unknown_parameter", param=param)
    if kind == "missing":
        return bad_request(f"Missing required field '{param}'.", code="missing_required_parameter", param=param)
    return bad_request(f"Invalid value{where}: {first['msg']}.", code="invalid_type", param=param)


# Union member names pydantic adds to error locations.
_TAGS = {"str", "bool", "int", "float", "list", "dict", "function-after", "function-before", "nullable"}


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


def _authorised(request: Request, settings: Settings) -> bool:
    if not settings.api_key:
        return True
    return request.headers.get("authorization", "") == f"Bearer {settings.api_key}"


def error_response(op: Operation, err: ApiError, extra_headers: dict[str, str] | None = None) -> JSONResponse:
    headers = {**(extra_headers or {}), **(err.headers or {})}
    return JSONResponse(error_body(op.error_family, err), status_code=err.status, headers=headers)


_handlers: dict[str, Callable[[Call], Awaitable[Any]]] = {}


def resolve(name: str) -> Callable[[Call], Awaitable[Any]]:
    if name not in _handlers:
        module, func = name.split(":")
        _handlers[name] = getattr(importlib.import_module(f"swama.handlers.{module}"), func)
    return _handlers[name]


async def dispatch(op: Operation, request: Request) -> Response:
    settings: Settings = request.app.state.settings
    call = Call(op, request, settings)
    if op.family == "systemone":
        call.extra_headers["x-typesafe-request-id"] = f"systemone-{uuid.uuid4()}"
    try:
        if not _authorised(request, settings):
            raise ApiError(401, "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        if op.method == "POST":
            call.body = await read_body(request, op.path)
        result = await resolve(op.handler)(call)
    except ApiError as err:
        return error_response(op, err, call.extra_headers)
    except EngineError as exc:
        return error_response(op, engine_error(exc), call.extra_headers)
    except DecisionError as exc:
        return error_response(op, ApiError(exc.status, exc.message), call.extra_headers)
    except Exception:  # a bug or a backend failure: never leak a traceback, never a bare 500 page
        log.exception("unhandled error in %s", op.operation_id)
        return error_response(op, ApiError(500, "Internal server error.", code="server_error"), call.extra_headers)
    if isinstance(result, Response):
        result.headers.update(call.extra_headers)
        return result
    return JSONResponse(result, headers=call.extra_headers)


def engine_error(exc: EngineError) -> ApiError:
    param = "model" if exc.code == "model_not_found" else None
    return ApiError(exc.status, exc.message, code=exc.code, param=param)


async def _until_disconnected(request: Request, every: float = 0.1) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(every)


async def collect_or_cancel(call: Call, events: AsyncIterator[T]) -> AsyncIterator[T]:
    """Iterate `events` while watching the client: a disconnect stops (and so cancels) the work."""
    watcher = asyncio.ensure_future(_until_disconnected(call.request))
    try:
        iterator = events.__aiter__()
        while True:
            step = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        watcher.cancel()
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def start_stream(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """Wait for the first event so errors before it become plain HTTP errors, then stream the rest."""
    iterator = events.__aiter__()
    try:
        first = await iterator.__anext__()
    except StopAsyncIteration:
        return _empty()

    async def rest() -> AsyncIterator[T]:
        try:
            yield first
            async for item in iterator:
                yield item
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

    return rest()


async def _empty() -> AsyncIterator[Any]:
    return
    yield


def not_implemented(call: Call, *, validate: bool = True) -> ApiError:
    """Validate the request as the spec says, then refuse honestly: the route is not served yet."""
    if validate and call.op.request_model is not None and call.op.media_type == "application/json":
        data = call.json()
        if not isinstance(data, dict):
            raise bad_request("Malformed request: top-level JSON must be an object", code="invalid_json")
        call.validate(data)
    return ApiError(501, f"{call.op.method} {call.op.path} is not implemented yet on this server.",
                    code="not_implemented")
