"""The model pool: load on first use, share concurrent loads, FIFO slots per model, idle eviction.

- A model is loaded once; concurrent requests for it wait on the same load.
- Exclusive work on one model runs one operation at a time, in arrival order; other models are not
  blocked. Shared holders (requests a model's batch scheduler serves together) take no lock: up to
  `capacity` of them run at once and the rest count as waiting.
- At most `max_concurrent` operations run at once across all models (FIFO as well).
- A model idle for `idle_seconds` is evicted and its memory released.
- A load that would not fit in memory (the system's available memory, or `memory_limit` bytes for
  all loaded models) first evicts idle models, least recently used first; when the models in the
  way are busy it is refused with a 503 that says how much it needs.
- A waiter that is cancelled (its client went away) leaves the queue.
- Admission is bounded: past `max_model_queue` requests waiting for one model, or `max_queue` waiting
  across the server, a new request is refused at once (429 with Retry-After) instead of queueing
  without end; one that waits longer than `queue_timeout` seconds gives up with a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from swama.engine.errors import (
    RETRY_AFTER_SECONDS,
    Busy,
    EngineError,
    LoadFailed,
    NotFound,
    Unavailable,
    without_folders,
)
from swama.engine.files.store import InstalledModel, ModelStore
from swama.engine.model import LoadedModel
from swama.engine.runtime import available_bytes
from swama.engine.serving.loaders import load_model
from swama.engine.serving.memory import gib, model_bytes
from swama.engine.serving.threads import run_parked
from swama.engine.settings import EngineSettings

log = logging.getLogger("swama.pool")


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loading: asyncio.Future[LoadedModel] | None = None
    model: LoadedModel | None = None
    last_used: float = field(default_factory=time.monotonic)
    active: int = 0
    shared: int = 0  # of `active`, the holders that share the model (batched work)
    capacity: int = 1  # shared holders that run at once
    nbytes: int = 0  # the loaded model's estimated size

    def running(self) -> int:
        return (1 if self.lock.locked() else 0) + min(self.shared, self.capacity)

    def waiting(self) -> int:
        return self.active - self.running()


def _load_failed(model_id: str, path: object, exc: Exception) -> LoadFailed:
    """A model whose files do not load: damaged, incomplete or not what their config says. The answer
    names no folder of the server's disk (the log does): paths in the reason are cut to their last part."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    log.warning("model %s could not be loaded from %s: %s", model_id, path, reason)
    return LoadFailed(f"Model '{model_id}' could not be loaded: {without_folders(reason)[:300]}. Its files may be "
                      f"damaged or incomplete; reinstall it (swama rm {model_id}, then swama pull or swama create).")


class ModelPool:
    def __init__(self, store: ModelStore, settings: EngineSettings, *, float_bytes: int | None = None,
                 loader: Callable[[str, Path], LoadedModel] = load_model) -> None:
        self.store = store
        self.loader = loader
        self.idle_seconds = settings.idle_seconds
        self.max_concurrent = settings.max_concurrent
        self.max_queue = settings.max_queue
        self.max_model_queue = settings.max_model_queue
        self.queue_timeout = settings.queue_timeout
        self.memory_limit = settings.memory_limit  # bytes for all loaded models; None: what the system has free
        self.float_bytes = float_bytes  # floating weights are cast to this size at load (None: as stored)
        self._slots = asyncio.Semaphore(self.max_concurrent)
        self._entries: dict[str, _Entry] = {}
        self._pinned: dict[str, int] = {}  # models split across ranks: never evicted; each rank holds 1/N
        self._reaper: asyncio.Task[None] | None = None

    def _installed(self, name: str) -> InstalledModel:
        """The installed model `name` names; NotFound (a 404) when there is none."""
        installed = self.store.find(name)
        if installed is None:
            raise NotFound()
        return installed

    def loaded(self) -> list[str]:
        return [k for k, e in self._entries.items() if e.model is not None]

    def loaded_models(self) -> list[LoadedModel]:
        return [e.model for e in self._entries.values() if e.model is not None]

    async def _load(self, model_id: str, entry: _Entry) -> LoadedModel:
        if entry.model is not None:
            return entry.model
        if entry.loading is None:
            installed = self._installed(model_id)
            need = model_bytes(installed.path, self.float_bytes) // self._pinned.get(installed.id, 1)
            self._make_room(installed.id, need)
            entry.nbytes = need
            loop = asyncio.get_running_loop()
            entry.loading = loop.create_future()

            async def run() -> None:
                try:
                    model = await run_parked(lambda: self.loader(installed.id, installed.path))
                except BaseException as exc:  # every waiter sees the failure; the next request retries
                    if isinstance(exc, Exception) and not isinstance(exc, EngineError):
                        log.warning("could not load %s: %s", installed.id, exc)
                        exc = _load_failed(installed.id, installed.path, exc)
                    entry.loading.set_exception(exc)
                    entry.loading.exception()  # mark retrieved
                    entry.loading = None
                    return
                entry.model = model
                entry.loading.set_result(model)
                log.info("loaded %s", installed.id)

            asyncio.ensure_future(run())
        # shield: one waiter's cancellation must not cancel the shared load
        return await asyncio.shield(entry.loading)

    def _make_room(self, model_id: str, need: int) -> None:
        """Evict idle models until `need` bytes fit; a 503 when the ones in the way are busy."""
        others = {k: e for k, e in self._entries.items() if k != model_id and (e.model or e.loading)}
        if self.memory_limit is not None:
            free = self.memory_limit - sum(e.nbytes for e in others.values())
            where = f"of the --memory-limit {gib(self.memory_limit)}"
        else:
            system = available_bytes()
            if system is None:
                return
            free, where = system, "available on this machine"
        idle = sorted((e.last_used, k) for k, e in others.items()
                      if e.model is not None and e.active == 0 and k not in self._pinned)
        while need > free and idle:
            _, victim = idle.pop(0)
            free += self._entries[victim].nbytes
            log.info("evicting %s to make room for %s", victim, model_id)
            self._drop(victim)
        if need > free:
            busy = ", ".join(k for k in self._entries if k != model_id and (self._entries[k].model or
                                                                           self._entries[k].loading))
            raise Unavailable(f"Not enough memory to load model '{model_id}': it needs about {gib(need)} and "
                              f"{gib(max(free, 0))} is free {where}"
                              + (f"; the loaded models ({busy}) are busy, retry when they finish." if busy
                                 else "; free memory or use a smaller (quantized) model."),
                              code="insufficient_memory")

    def pin(self, model_id: str, shares: int) -> None:
        """Keep `model_id` loaded for good and count 1/`shares` of its size: the ranks of a group
        hold the other shares and keep their state in step with this one."""
        self._pinned[model_id] = shares

    def weights_bytes(self) -> int:
        """The estimated size of the models loaded or loading (what --memory-limit counts them as)."""
        return sum(e.nbytes for e in self._entries.values() if e.model or e.loading)

    def running(self) -> int:
        """Operations (and batch rows) running on a model now."""
        return sum(e.running() for e in self._entries.values())

    def waiting(self) -> int:
        """Requests admitted and not yet running, across all models."""
        return sum(e.waiting() for e in self._entries.values())

    def _admit(self, model_id: str, entry: _Entry, shared: bool) -> None:
        waiting_here = entry.waiting()
        if shared and entry.shared < entry.capacity and not waiting_here:
            return  # a free batch row
        if not shared and not (entry.lock.locked() or waiting_here or self._slots.locked()):
            return  # it runs at once: nothing to queue behind
        if waiting_here >= self.max_model_queue:
            raise Busy(f"Too many requests: server at capacity for model '{model_id}' ({waiting_here} waiting, "
                       f"the limit is {self.max_model_queue}, --max-model-queue); retry after {RETRY_AFTER_SECONDS} s.")
        if self.waiting() >= self.max_queue:
            raise Busy(f"Too many requests: server at capacity ({self.waiting()} waiting across models, the "
                       f"limit is {self.max_queue}, --max-queue); retry after {RETRY_AFTER_SECONDS} s.")

    async def _acquire(self, lock: asyncio.Lock | asyncio.Semaphore, deadline: float, model_id: str) -> None:
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await lock.acquire()
        except TimeoutError:
            raise self._timed_out(model_id) from None

    def _timed_out(self, model_id: str) -> Unavailable:
        return Unavailable(f"Timed out after {self.queue_timeout:g} s waiting for model '{model_id}' "
                           "(--queue-timeout); the server is busy, retry later.", code="queue_timeout")

    @contextlib.asynccontextmanager
    async def use(self, name: str, *, admit: bool = True) -> AsyncIterator[LoadedModel]:
        """Hold `name` exclusively (FIFO) for one operation. `admit=False` is for the later turns of
        work already admitted (a decision request's questions), which are never refused."""
        installed, entry = self._entry_for(name)
        if admit:
            self._admit(installed.id, entry, shared=False)
        entry.active += 1
        deadline = time.monotonic() + self.queue_timeout
        try:
            await self._acquire(entry.lock, deadline, installed.id)
            try:
                await self._acquire(self._slots, deadline, installed.id)
                try:
                    with self._in_use(entry):
                        yield await self._load(installed.id, entry)
                finally:
                    self._slots.release()
            finally:
                entry.lock.release()
        finally:
            entry.active -= 1

    @contextlib.asynccontextmanager
    async def share(self, name: str, capacity: int) -> AsyncIterator[LoadedModel]:
        """Hold `name` loaded, without exclusivity, for work its batch scheduler runs; `capacity`
        holders run at once and the ones past it count against the queue limits."""
        installed, entry = self._entry_for(name)
        entry.capacity = capacity
        self._admit(installed.id, entry, shared=True)
        entry.active += 1
        entry.shared += 1
        try:
            try:
                async with asyncio.timeout(self.queue_timeout):
                    model = await self._load(installed.id, entry)
            except TimeoutError:
                raise self._timed_out(installed.id) from None
            with self._in_use(entry):
                yield model
        finally:
            entry.active -= 1
            entry.shared -= 1

    def _entry_for(self, name: str) -> tuple[InstalledModel, _Entry]:
        """The installed model `name` names (NotFound before any waiting) and its pool entry."""
        installed = self._installed(name)
        self._ensure_reaper()
        return installed, self._entries.setdefault(installed.id, _Entry())

    @staticmethod
    @contextlib.contextmanager
    def _in_use(entry: _Entry) -> Iterator[None]:
        """Idle time counts from the end of the last use, not its start."""
        entry.last_used = time.monotonic()
        try:
            yield
        finally:
            entry.last_used = time.monotonic()

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap_forever())

    async def _reap_forever(self) -> None:
        interval = max(0.5, min(60.0, self.idle_seconds / 4))
        while True:
            await asyncio.sleep(interval)
            self.evict_idle()

    def evict_idle(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        evicted = []
        for model_id, entry in list(self._entries.items()):
            if (entry.model is not None and entry.active == 0 and model_id not in self._pinned
                    and now - entry.last_used >= self.idle_seconds):
                self._drop(model_id)
                evicted.append(model_id)
        return evicted

    def _drop(self, model_id: str) -> None:
        entry = self._entries.pop(model_id, None)
        if entry is not None and entry.model is not None:
            entry.model.close()
            entry.model = None
        gc.collect()
        try:
            import mlx.core as mx

            mx.clear_cache()
        except Exception:  # pragma: no cover - best effort
            pass
        log.info("evicted %s", model_id)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for model_id in list(self._entries):
            self._drop(model_id)
