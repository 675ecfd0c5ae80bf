"""The engine process: the in-process engine (engine/serving/engine.py) behind the channel.

What the server process asks (engine/process/proxy.py), one message each, numbered by the asker:

    ("call", n, method, args, kwargs)    an engine method's result: ("ok", n, value) or ("error", n, exc)
    ("stream", n, method, args, kwargs)  an engine method's items: ("item", n, x)..., then ("end", n) or ("error", n, exc)
    ("tokens", n, model, ids, request, opens_thinking)
                                         a generation of a prompt the server process rendered and tokenized:
                                         ("tokens", [(n, token, finish reason, log probabilities, drafted,
                                         reused, from_disk), ...]) once per batch step for all its rows, then ("end", n)
                                         or ("error", n, exc); ("unbatched", n) when the model's batch cannot
                                         take it (the asker then streams "chat" instead)
    ("cancel", n)                        the asker is gone: stop that work
    ("close",)                           unload and exit

It also says, unasked: ("ready", pid) once it serves, and ("notice", "decisions", model, questions,
prefix tokens) for the server's metrics. Each batch step's tokens are sent by the scheduler thread
itself, one message for all rows, so the event loop of this process never handles them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
from collections.abc import Callable
from typing import Any

from swama.engine.errors import EngineError, Failed
from swama.engine.process.channel import Sender, connect, frames
from swama.engine.serving.engine import Engine
from swama.engine.settings import EngineSettings

log = logging.getLogger("swama.engine.process")


def portable(exc: BaseException) -> BaseException:
    """An exception the other process can rebuild: the engine's own kinds travel whole, anything else
    as a Failed naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return Failed(f"{type(exc).__name__}: {exc}", code="engine_error")


class ChannelSink:
    """Where the batch puts the tokens of rows a front end asked for over the channel (the scheduler's
    `Sink`): one message a step for all of them, written from the scheduler thread."""

    def __init__(self, sender: Sender, loop: asyncio.AbstractEventLoop) -> None:
        self.sender = sender
        self.loop = loop
        self.ended: dict[int, asyncio.Event] = {}  # by job number: set when its last message is sent

    def _end(self, cid: int) -> None:
        event = self.ended.get(cid)
        if event is not None:
            self.loop.call_soon_threadsafe(event.set)

    def post(self, job: Any, item: Any) -> None:
        if isinstance(item, BaseException):
            self.sender.send(("error", job.cid, portable(item)))
        else:  # the end, with no token (a cancelled job that never joined the batch)
            self.sender.send(("end", job.cid))
        self._end(job.cid)

    def deliver(self, tokens: list[tuple[Any, int, str | None, Any, int]]) -> None:
        self.sender.send(("tokens", [(job.cid, token, finish, reading, drafted, job.reused, job.from_disk)
                                     for job, token, finish, reading, drafted in tokens]))
        for job, _, finish, _, _ in tokens:
            if finish is not None:
                self._end(job.cid)


class Core:
    """One engine and the work the channel asked of it."""

    def __init__(self, engine: Engine, sender: Sender, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.sender = sender
        self.sink = ChannelSink(sender, loop)
        self.work: dict[int, asyncio.Task[None]] = {}
        engine.on_decisions = lambda *args: sender.send(("notice", "decisions", *args))

    def start(self, n: int, job: Callable[[], Any]) -> None:
        task = asyncio.ensure_future(job())
        self.work[n] = task
        task.add_done_callback(lambda _: self.work.pop(n, None))

    async def call(self, n: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            result = getattr(self.engine, method)(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = await result
        except asyncio.CancelledError:
            return
        except BaseException as exc:
            self.sender.send(("error", n, portable(exc)))
            return
        self.sender.send(("ok", n, result))

    async def stream(self, n: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        items = getattr(self.engine, method)(*args, **kwargs)
        try:
            async for item in items:
                self.sender.send(("item", n, item))
        except asyncio.CancelledError:
            return
        except BaseException as exc:
            self.sender.send(("error", n, portable(exc)))
            return
        finally:
            await items.aclose()
        self.sender.send(("end", n))

    async def tokens(self, n: int, model_id: str, ids: list[int], request: Any, opens_thinking: bool) -> None:
        ended = self.sink.ended[n] = asyncio.Event()
        try:
            if not await self.engine.stream_tokens(model_id, ids, request, opens_thinking, self.sink, n, ended):
                self.sender.send(("unbatched", n))
        except asyncio.CancelledError:
            return
        except BaseException as exc:
            if not ended.is_set():  # refused before it joined (admission, a bad grammar, unloading)
                self.sender.send(("error", n, portable(exc)))
        finally:
            self.sink.ended.pop(n, None)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        async for message in frames(reader):
            kind = message[0]
            if kind == "close":
                break
            if kind == "cancel":
                task = self.work.get(message[1])
                if task is not None:
                    task.cancel()
            elif kind == "call":
                self.start(message[1], lambda m=message: self.call(*m[1:]))
            elif kind == "stream":
                self.start(message[1], lambda m=message: self.stream(*m[1:]))
            elif kind == "tokens":
                self.start(message[1], lambda m=message: self.tokens(*m[1:]))
        for task in list(self.work.values()):
            task.cancel()
        await self.engine.close()


async def run(settings: EngineSettings, inbox: socket.socket, outbox: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    sender = Sender(outbox)
    core = Core(Engine(settings), sender, loop)
    reader, reader_end = await connect(inbox)
    sender.send(("ready", os.getpid()))
    try:
        await core.serve(reader)
    finally:
        sender.close()
        reader_end.close()


def main(inbox_fd: int, outbox_fd: int, settings_json: str) -> int:
    """The engine process: serve the channel until the server process closes it or goes away (its
    end of the channel closes, so this one reads the end of it)."""
    from swama.engine.runtime import activate_device

    # Ctrl-C reaches the whole process group; the server process decides when this one stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    activate_device()
    settings = EngineSettings.model_validate_json(settings_json)
    inbox = socket.socket(fileno=inbox_fd)
    outbox = socket.socket(fileno=outbox_fd)
    try:
        asyncio.run(run(settings, inbox, outbox))
    except EngineError as exc:
        log.error("the engine process stopped: %s", exc)
        return 1
    return 0

