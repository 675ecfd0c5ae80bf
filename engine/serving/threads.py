"""Threads for MLX work that never end.

MLX gives each thread its own streams, and a thread that ends while the interpreter exits can abort
the process as its streams are torn down ("terminate called without an active exception"). Every
thread that may touch MLX (model loads, batch schedulers, one-at-a-time model work) is therefore
taken from here: it parks when its work is done, is reused by the next piece of work, and is simply
left behind at exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = object()


class ParkedThreads:
    def __init__(self) -> None:
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], T], name: str = "swama-mlx") -> concurrent.futures.Future[T]:
        """Run `work` on a parked thread (or a new one); the future holds its result or exception."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(work())
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name=name, daemon=True).start()
        inbox.put(job)
        return future

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            inbox.get()()
            with self._lock:
                self._idle.append(inbox)


THREADS = ParkedThreads()


async def run_parked(work: Callable[[], T]) -> T:
    """Await `work` run on a parked thread (the asyncio counterpart of `asyncio.to_thread`)."""
    return await asyncio.wrap_future(THREADS.submit(work))


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def iterate_in_thread(make: Callable[[threading.Event], Iterator[T]]) -> AsyncIterator[T]:
    """Run a blocking iterator on a parked thread, yielding its items on the event loop."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    cancel = threading.Event()

    def worker() -> None:
        try:
            for item in make(cancel):
                loop.call_soon_threadsafe(queue.put_nowait, item)
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            loop.call_soon_threadsafe(queue.put_nowait, _Failure(exc))

    finished = asyncio.wrap_future(THREADS.submit(worker, "swama-worker"))
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        cancel.set()
        # The model stays reserved until its worker really stopped.
        await asyncio.shield(finished)


async def in_thread(step: Callable[[], T], cancel: threading.Event | None = None) -> T:
    """Run one blocking step on a parked thread. Even when the caller is cancelled it waits for the
    step to end, so the model slot it holds is never handed on while the model is still busy;
    `cancel`, when given, is set first so a step that watches it ends early."""
    task = asyncio.wrap_future(THREADS.submit(step, "swama-worker"))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if cancel is not None:
            cancel.set()
        await asyncio.wait({task})
        raise

