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
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


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
