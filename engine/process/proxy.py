"""The server process's side of the engine process: the door (`EngineClient`), served by a child
process that runs the engine (engine/process/core.py).

The front end stays here: chat prompts are rendered and tokenized here (with the model's tokenizer
alone, no weights), the engine process generates their tokens in its batch, and every step's
tokens come back in one message, to be turned into text, stop sequences, tool calls and thinking
here (text/generator.py `Decoder`). A stop sequence found here cancels the row there. Everything
else the door offers (decisions, embeddings, speech, tokenizing, scoring) is asked of the engine
process as a call or a stream of items; what needs no loaded model (the store, a model's tasks, a
speech model's voices) is answered here.

The child is supervised: when it exits (a crash, the out-of-memory killer), every request in
flight ends with a 503 (`engine_restarted`) and a new one starts; requests that come meanwhile wait
for it, as long as --queue-timeout allows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from swama.engine.errors import Cancelled, EngineError, Unavailable
from swama.engine.files.kinds import LANGUAGE
from swama.engine.files.store import InstalledModel, ModelStore
from swama.engine.model import LoadedModel
from swama.engine.priority import BATCH
from swama.engine.process.channel import connect, encode, frames
from swama.engine.serving.engine import EngineStatus, check_generation
from swama.engine.serving.installed import InstalledModels
from swama.engine.serving.threads import in_thread
from swama.engine.settings import EngineSettings
from swama.engine.text.generator import ChatRequest, Decoder, Event, Finished, prepare, quick_to_prepare

log = logging.getLogger("swama.engine.process")
SETTINGS_VARIABLE = "SWAMA_ENGINE_SETTINGS"
START_TIMEOUT = 300.0  # seconds for a new engine process to import MLX and say it is ready
STOP_TIMEOUT = 10.0  # seconds it may take to unload and exit before it is killed
RESTART_PAUSE = 0.5  # seconds between a crash and the next start (more after each failed start)
_END = object()
_UNBATCHED = object()


class _Waiter:
    """One piece of work asked of the engine process: its result, or its items in a queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def fail(self, error: BaseException) -> None:
        self.queue.put_nowait(error)


class _Tokens(_Waiter):
    """A generation whose tokens come from the engine process, decoded here."""

    def __init__(self, decoder: Decoder, cancel: Callable[[], None]) -> None:
        super().__init__()
        self.decoder = decoder
        self.cancel = cancel
        self.ended = False

    def feed(self, token: int, finish: str | None, reading: Any, drafted: int, reused: int, from_disk: int) -> None:
        if self.ended:
            return  # tokens the row made before the cancel for its stop sequence reached it
        self.decoder.drafted = drafted
        events, self.ended = self.decoder.step(token, finish, reading, reused, from_disk)
        for event in events:
            self.queue.put_nowait(event)
        if self.ended:
            self.queue.put_nowait(_END)
            if finish is None:  # a stop sequence (or a lone tool call) ended it here: the row goes there
                self.cancel()


@dataclasses.dataclass
class _Child:
    process: subprocess.Popen[bytes]
    writer: asyncio.StreamWriter
    reader: asyncio.StreamReader
    pid: int
    reader_end: asyncio.StreamWriter  # held: dropping it would close the socket the reader reads


class EngineProcess(InstalledModels):
    """`EngineClient` over an engine process this one starts, supervises and restarts."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.store = ModelStore(settings.models_root)
        self.on_generation: Callable[[str, Finished], None] | None = None
        self.on_decisions: Callable[[str, int, int], None] | None = None
        # Only the engine's own settings travel (a server's API key stays here).
        self._settings_json = EngineSettings(**{k: getattr(settings, k) for k in EngineSettings.model_fields}
                                             ).model_dump_json()
        self._numbers = itertools.count(1)
        self._waiting: dict[int, _Waiter] = {}
        self._faces: dict[str, asyncio.Future[LoadedModel]] = {}  # tokenizer-only models, by id
        self._unbatched: set[str] = set()  # models whose batch cannot take tokens (their caches do not merge)
        self._child: _Child | None = None
        self._up = asyncio.Event()
        self._closing = False
        self._started = False
        self._supervisor: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self.restarts = 0
        self._status = EngineStatus([], 0, 0, "unknown", 0, 0)

    # -- the child ---------------------------------------------------------------------------------

    async def _spawn(self) -> _Child:
        inbox, their_inbox = socket.socketpair()
        outbox, their_outbox = socket.socketpair()
        env = {**os.environ, SETTINGS_VARIABLE: self._settings_json}
        process = subprocess.Popen([sys.executable, "-m", "swama.engine.process", str(their_inbox.fileno()),
                                    str(their_outbox.fileno())], pass_fds=(their_inbox.fileno(),
                                                                           their_outbox.fileno()),
                                   env=env, stdin=subprocess.DEVNULL)
        their_inbox.close()
        their_outbox.close()
        _, writer = await connect(inbox)
        reader, keep = await connect(outbox)
        messages = frames(reader)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                ready = await anext(messages, None)
        except TimeoutError:
            ready = None
        if not (isinstance(ready, tuple) and ready[0] == "ready"):
            keep.close()
            process.kill()
            await asyncio.to_thread(process.wait)
            raise Unavailable(f"The engine process did not start (exit status {process.returncode}); see the "
                              "server's log.", code="engine_unavailable")
        return _Child(process, writer, reader, ready[1], keep)

    async def _supervise(self, first: _Child) -> None:
        """Keep a child running: read its messages; when it ends, fail what was in flight and start
        another."""
        pause = RESTART_PAUSE
        child: _Child | None = first
        while not self._closing:
            try:
                child = child or await self._spawn()
            except EngineError as exc:
                log.error("%s Retrying in %.1f s.", exc.message, pause)
                await asyncio.sleep(pause)
                pause = min(10.0, pause * 2)
                continue
            pause = RESTART_PAUSE
            self._child = child
            reading = asyncio.ensure_future(self._read(child))
            if self._started:
                try:
                    await self._call_on(child, "start")  # a rank group's model, loaded again
                except EngineError as exc:
                    log.error("the restarted engine could not start: %s", exc.message)
            self._up.set()
            await reading
            self._up.clear()
            self._child = None
            child.writer.close()
            child.reader_end.close()
            code = await asyncio.to_thread(child.process.wait)
            if self._closing:
                break
            self.restarts += 1
            log.error("the engine process (pid %d) exited with status %s; starting another", child.pid, code)
            error = Unavailable(f"The engine process stopped (exit status {code}) and is being restarted; "
                                "retry shortly.", code="engine_restarted")
            waiting, self._waiting = self._waiting, {}
            for waiter in waiting.values():
                waiter.fail(error)
            child = None
            await asyncio.sleep(RESTART_PAUSE)

    async def _read(self, child: _Child) -> None:
        async for message in frames(child.reader):
            self._dispatch(message)

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "tokens":
            for n, *row in message[1]:
                waiter = self._waiting.get(n)
                if waiter is not None:
                    waiter.feed(*row)
            return
        if kind == "notice":
            if message[1] == "decisions" and self.on_decisions is not None:
                self.on_decisions(*message[2:])
            return
        waiter = self._waiting.get(message[1])
        if waiter is None:
            return
        if kind in ("ok", "item"):
            waiter.queue.put_nowait(message[2])
        elif kind == "error":
            waiter.fail(message[2])
        elif kind == "end":
            waiter.queue.put_nowait(_END)
        elif kind == "unbatched":
            waiter.queue.put_nowait(_UNBATCHED)

    async def _ready_child(self) -> _Child:
        """The running child, waiting (within --queue-timeout) while one starts (the first one
        starts here when nobody called `start`)."""
        if self._supervisor is None:
            await self.start()
        if not self._up.is_set():
            try:
                async with asyncio.timeout(self.settings.queue_timeout):
                    await self._up.wait()
            except TimeoutError:
                raise Unavailable(f"The engine process is restarting and was not back within {self.settings.queue_timeout:g} "
                                  "s (--queue-timeout); retry later.", code="engine_unavailable") from None
        return self._child

    # -- asking it ---------------------------------------------------------------------------------

    async def _ask(self, waiter: _Waiter, message: Callable[[int], tuple[Any, ...]],
                   child: _Child | None = None) -> tuple[int, _Child]:
        child = child or await self._ready_child()
        n = next(self._numbers)
        self._waiting[n] = waiter
        child.writer.write(encode(message(n)))
        return n, child

    def _forget(self, n: int, child: _Child, cancel: bool) -> None:
        self._waiting.pop(n, None)
        if cancel and self._child is child and not child.writer.is_closing():
            child.writer.write(encode(("cancel", n)))

    async def _call_on(self, child: _Child | None, method: str, *args: Any, **kwargs: Any) -> Any:
        waiter = _Waiter()
        n, child = await self._ask(waiter, lambda n: ("call", n, method, args, kwargs), child)
        done = False
        try:
            result = await waiter.queue.get()
            done = True
        finally:
            self._forget(n, child, cancel=not done)
        if isinstance(result, BaseException):
            raise result
        return result

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call_on(None, method, *args, **kwargs)

    async def _stream(self, method: str, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        waiter = _Waiter()
        n, child = await self._ask(waiter, lambda n: ("stream", n, method, args, kwargs))
        done = False
        try:
            while True:
                item = await waiter.queue.get()
                if item is _END:
                    done = True
                    return
                if isinstance(item, BaseException):
                    done = True
                    raise item
                yield item
        finally:
            self._forget(n, child, cancel=not done)

    # -- the door ----------------------------------------------------------------------------------

    def status(self) -> EngineStatus:
        return dataclasses.replace(self._status, process={"pid": self._child.pid if self._child else None,
                                                          "restarts": self.restarts})

    async def refresh(self) -> None:
        if self._up.is_set():
            try:
                self._status = await self._call("status")
            except EngineError:  # it went away meanwhile: the last reading stands
                pass

    async def start(self) -> None:
        """Start the engine process (an error when it cannot start at all), then supervise it. Once:
        a second caller waits for the first start."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        first = await self._spawn()
        self._supervisor = asyncio.ensure_future(self._supervise(first))
        await self._up.wait()
        await self._call("start")
        self._started = True

    async def close(self) -> None:
        self._closing = True
        child = self._child
        if child is not None and not child.writer.is_closing():
            child.writer.write(encode(("close",)))
            try:
                await asyncio.wait_for(asyncio.to_thread(child.process.wait), STOP_TIMEOUT)
            except TimeoutError:
                child.process.kill()
        if self._supervisor is not None:
            self._supervisor.cancel()
        if child is not None:
            child.writer.close()

    async def chat(self, model_id: str, request: ChatRequest) -> AsyncIterator[Event]:
        """Events of one generation: its prompt rendered and tokenized here, its tokens made by the
        engine process's batch and decoded here. Stop iterating (or `aclose()`) to cancel."""
        submitted = time.perf_counter()
        check_generation(request, self.settings)
        request = dataclasses.replace(request, batch=request.batch or BATCH.get())
        installed = self.model(model_id)
        try:
            if installed.kind != LANGUAGE or not self.settings.batching or installed.id in self._unbatched:
                async for event in self._stream("chat", model_id, request):
                    self._observe(model_id, event)
                    yield event
                return
            face = await self._face(self.base_of(installed))
            prompt = prepare(face, request) if quick_to_prepare(request) else await in_thread(lambda: prepare(face, request))
            decoder = Decoder(face, request, len(prompt.ids), None, prompt.opens_thinking)
            decoder.started = submitted  # time to first token counts the preparation and the wait for a row
            # The engine needs the request's options, not its messages (the prompt is rendered here).
            options = dataclasses.replace(request, messages=[], tools=None, images=[], prompt=None)
            holder: dict[str, Any] = {}
            waiter = _Tokens(decoder, lambda: self._forget(holder["n"], holder["child"], cancel=True))
            n, child = await self._ask(waiter, lambda n: ("tokens", n, installed.id, prompt.ids, options,
                                                          prompt.opens_thinking))
            holder.update(n=n, child=child)
            done = False
            try:
                while True:
                    item = await waiter.queue.get()
                    if item is _UNBATCHED:
                        self._unbatched.add(installed.id)
                        done = True
                        break
                    if item is _END:
                        done = True
                        return
                    if isinstance(item, BaseException):
                        done = True
                        raise item
                    self._observe(model_id, item)
                    yield item
            finally:
                self._forget(n, child, cancel=not done)
            async for event in self._stream("chat", model_id, request):  # its batch cannot take tokens
                self._observe(model_id, event)
                yield event
        except Cancelled:
            return

    async def _face(self, installed: InstalledModel) -> LoadedModel:
        """The model's tokenizer, chat template and end tokens, loaded here once (no weights)."""
        from swama.engine.text.language import load_language_face

        future = self._faces.get(installed.id)
        if future is None or (future.done() and future.exception() is not None):
            future = self._faces[installed.id] = asyncio.ensure_future(
                in_thread(lambda: load_language_face(installed.id, Path(installed.path))))
        return await asyncio.shield(future)

    def _observe(self, model_id: str, event: Event) -> None:
        if isinstance(event, Finished) and self.on_generation is not None:
            self.on_generation(model_id, event)

    async def tokenize_prompt(self, model_id: str, prompt: str | list[int]) -> list[int]:
        return await self._call("tokenize_prompt", model_id, prompt)

    async def score_prompt(self, model_id: str, ids: list[int], top: int = 0, temperature: float = 1.0) -> Any:
        return await self._call("score_prompt", model_id, ids, top, temperature)

    async def decide(self, model_id: str, job: Any) -> AsyncIterator[Any]:
        job = dataclasses.replace(job, batch=job.batch or BATCH.get())
        async for result in self._stream("decide", model_id, job):
            yield result

    async def rerank(self, model_id: str, job: Any) -> AsyncIterator[Any]:
        async for result in self._stream("rerank", model_id, job):
            yield result

    async def predict_checkpoint(self, model_id: str, state: Any, questions: dict[str, dict[str, Any]],
                                 images: list[Any]) -> Any:
        return await self._call("predict_checkpoint", model_id, state, questions, images)

    async def embed(self, model_id: str, texts: list[str], dimensions: int | None = None) -> Any:
        return await self._call("embed", model_id, texts, dimensions)

    async def speak(self, model_id: str, text: str, voice: str | None, speed: float) -> AsyncIterator[Any]:
        async for segment in self._stream("speak", model_id, text, voice, speed):
            yield segment

    async def transcribe(self, model_id: str, audio: Any, *, language: str | None = None,
                         prompt: str | None = None, temperature: float = 0.0) -> Any:
        return await self._call("transcribe", model_id, audio, language=language, prompt=prompt,
                                temperature=temperature)

    async def tokenize(self, model_id: str, job: Any) -> Any:
        return await self._call("tokenize", model_id, job)

    async def detokenize(self, model_id: str, ids: list[int]) -> str:
        return await self._call("detokenize", model_id, ids)
