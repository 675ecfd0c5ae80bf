"""The ingress: one light deployment behind Serve's HTTP proxy that takes every path and method (its
`__call__` gets each HTTP request), reads the request, works out its affinity key and forwards it to
the engine replicas through a deployment handle (the key rides in the handle's session_id, where the
request router reads it). The response streams back as the replica sends it. A replica that fails
before answering is a 503 in the route's error envelope; one that fails mid-stream ends the stream
the way the route ends an engine failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from swama.handlers.http.body import read_raw_body
from swama.handlers.http.errors import ApiError
from swama.handlers.scale.affinity import affinity_key
from swama.handlers.scale.failures import StreamWatch, failure_message, failure_response, replica_failed
from swama.handlers.scale.wire import ForwardedRequest, ResponseStart

if TYPE_CHECKING:  # Ray is imported where the ingress runs (it is the `scale` extra)
    from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

log = logging.getLogger("swama.replicas")
REQUEST_ID = b"x-request-id"


def _cause(exc: BaseException) -> str:
    from ray.exceptions import RayActorError

    if isinstance(exc, RayActorError):
        return "its process exited"
    return type(exc).__name__


def _busy(exc: BaseException) -> bool:
    from ray.serve.exceptions import BackPressureError

    return isinstance(exc, BackPressureError)


class Ingress:
    """The ingress deployment's class (replicas.py makes it a Serve deployment)."""

    def __init__(self, engine: DeploymentHandle, api_key: str | None = None) -> None:
        self.engine = engine.options(stream=True)
        self.api_key = api_key

    def _keyed(self, request: Request) -> bool:
        """Whether the request may carry a body to a replica: no key is set, or it sends one (the replica
        checks it is the right one, answering in the route's envelope)."""
        if not self.api_key:
            return True
        return request.headers.get("authorization", "").startswith("Bearer ") or "x-api-key" in request.headers

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        # The body is read only for a request that sends a key, and only up to the route's limit: one
        # without is forwarded bodiless, for the replica to refuse in the route's envelope.
        try:
            body = await read_raw_body(request, path) if self._keyed(request) else b""
        except ApiError as err:
            return failure_response(path, err)
        forwarded = ForwardedRequest(request.method, path, request.scope.get("query_string", b""),
                                     list(request.scope["headers"]), body,
                                     tuple(request.client) if request.client else None, request.url.scheme)
        key = affinity_key(path, body) if request.method == "POST" else ""
        stream: DeploymentResponseGenerator = self.engine.options(session_id=key).forward.remote(forwarded)
        try:
            start = await stream.__anext__()
        except asyncio.CancelledError:  # the client went away before the response began
            stream.cancel()
            raise
        except Exception as exc:  # the replica failed, or its call did: never a hang, never a bare 500
            stream.cancel()
            if _busy(exc):
                return failure_response(path, ApiError(
                    429, "Every replica is busy and the queue before them is full; retry in a moment.",
                    code="rate_limit_exceeded", headers={"Retry-After": "1"}))
            log.warning("%s %s: replica failed before answering: %r", request.method, path, exc)
            return replica_failed(path, _cause(exc))
        if not isinstance(start, ResponseStart):
            stream.cancel()
            return replica_failed(path, "it answered out of order")
        watch = StreamWatch(path, start.header(b"content-type"))
        response = StreamingResponse(self._rest(stream, watch, request.method), status_code=start.status)
        # The proxy adds the request id it gave the request; the replica's copy of it would be a second one.
        sent_id = request.headers.get("x-request-id", "").encode()
        response.raw_headers = [(k, v) for k, v in start.headers if not (k.lower() == REQUEST_ID and v == sent_id)]
        return response

    async def _rest(self, stream: DeploymentResponseGenerator, watch: StreamWatch, method: str) -> AsyncIterator[bytes]:
        done = False
        try:
            async for chunk in stream:
                watch.feed(chunk)
                yield chunk
            done = True
        except Exception as exc:
            done = True
            log.warning("%s %s: replica failed mid-response: %r", method, watch.path, exc)
            if tail := watch.tail(failure_message(_cause(exc))):
                yield tail
        finally:
            if not done:  # the client went away: stop the replica's work
                stream.cancel()
