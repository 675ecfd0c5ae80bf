"""One engine replica: the whole swama app (every route, /health, /metrics, streaming) with its own
engine, run in the replica's process and driven through ASGI by the requests the ingress forwards.

The response goes back as it is sent: its start (status and headers) first, then each body chunk,
so a stream reaches the client token by token. When the ingress stops reading (its client went
away), Serve cancels the call here, and the app sees its client disconnect, which stops the work.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from swama.handlers.http.settings import ServerSettings
from swama.handlers.scale.wire import ForwardedRequest, ResponseStart

Message = dict[str, Any]
ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]
REPLICA_HEADER = b"x-swama-replica"
# How long an app whose client went away may take to stop by itself (its routes poll every 0.1 s).
DISCONNECT_GRACE_SECONDS = 2.0


class ReplicaIdentity:
    """Says which replica answered: `x-swama-replica` on every response, and a `replica` object (id,
    pid, node) in /health's JSON."""

    def __init__(self, app: ASGIApp, identity: dict[str, Any]) -> None:
        self.app = app
        self.identity = identity
        self.header = (REPLICA_HEADER, str(identity["id"]).encode())

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        health = scope["path"] == "/health" and scope["method"] == "GET"
        held: list[Message] = []

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
                if health:
                    held.append(message)
                    return
            if health and message["type"] == "http.response.body":
                held.append(message)
                if message.get("more_body"):
                    return
                start, body = held[0], b"".join(m.get("body", b"") for m in held[1:])
                body = self._with_identity(start, body)
                headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
                message = {"type": "http.response.body", "body": body, "more_body": False}
            await send(message)

        await self.app(scope, receive, tagged)

    def _with_identity(self, start: Message, body: bytes) -> bytes:
        if start["status"] != 200:
            return body
        try:
            data = json.loads(body)
        except ValueError:
            return body
        return (json.dumps({**data, "replica": self.identity}, ensure_ascii=False, separators=(",", ":")).encode()
                if isinstance(data, dict) else body)


async def run_asgi(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
    """Run one request through `app`: its ResponseStart, then its body chunks. An error the app
    raises after the response began is raised here, so the ingress ends the stream with an error."""
    sent: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()
    body = [request.body]

    async def receive() -> Message:
        if body:
            return {"type": "http.request", "body": body.pop(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await sent.put(message)

    task = asyncio.ensure_future(app(request.scope(), receive, send))
    task.add_done_callback(lambda _: sent.put_nowait(None))
    complete = False
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                yield ResponseStart(message["status"], [(bytes(k), bytes(v)) for k, v in message.get("headers", [])])
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    complete = True
                    break
        if not complete:
            task.result()  # the app's own error, when it failed mid-response
            raise RuntimeError(f"the app ended {request.method} {request.path} without a complete response")
    finally:
        gone.set()  # a cancelled call (the client went away) is the app's client disconnecting
        if not complete:
            # The app stops its work when it sees the disconnect; a moment later it is cancelled.
            await asyncio.wait({task}, timeout=DISCONNECT_GRACE_SECONDS)
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class EngineReplica:
    """The engine deployment's class (replicas.py makes it a Serve deployment)."""

    def __init__(self, settings: ServerSettings) -> None:
        import ray
        from ray import serve

        from swama.engine.client import keep_torch_out

        keep_torch_out()  # a Ray worker is a process of its own: as `swama serve` keeps PyTorch out, before any model
        from swama.handlers.http.app import create_app

        # As `swama serve` sets up its process: the access lines and swama's own log, here on the
        # replica's stderr, which Ray passes on to the server's.
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("swama.access").setLevel(settings.log_level.upper())
        identity = {"id": serve.get_replica_context().replica_id.unique_id, "pid": os.getpid(),
                    "node": ray.util.get_node_ip_address()}
        self.app = create_app(settings)
        self.asgi = ReplicaIdentity(self.app, identity)

    async def forward(self, request: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
        async for item in run_asgi(self.asgi, request):
            yield item

    async def __del__(self) -> None:
        # Serve calls this once on a graceful stop: models unload and the scheduler threads end.
        await self.app.state.engine.close()
