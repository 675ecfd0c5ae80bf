"""The batch scheduler: one thread per loaded language model that owns all of that model's MLX work.

Chat and responses requests join one continuous batch (mlx-lm's `BatchGenerator`) and leave it when
they finish, between steps. Each turn of the loop:

1. new requests, whose prompts were rendered and tokenized on a worker thread before they were
   submitted, are inserted (token budget, sampler), resuming from the prompt cache's longest
   matching prefix;
2. rows whose client went away are removed, and their key/value state goes back to the prompt cache;
3. one queued task runs (a decision request's prefix prefill), so decisions share the model
   fairly; then one batched pass is launched on the pending questions of every decision request
   waiting on the model (up to `decision_rows` rows: `DECISION_ROWS`, or `--batch-rows` when that
   is larger; round robin over the requests), and the pass launched last turn is read back into
   answers while the new one computes;
4. one batch step: a decode token for every generating row, plus one prefill chunk of at most
   `prefill_step` tokens for rows still reading their prompts, so a long prompt never freezes the
   streams already generating.

After each step the new tokens of all rows go to the event loop in one call. On a GPU each row's
`Decoder` turns them into events there (detokenizing, stop sequences, tool calls), so the thread
that drives the device does no text work; on the CPU, whose cores are the device, the decoders run
on this thread between steps and the events go in that one call. A row whose decoder meets a stop
sequence is taken out at the next turn, as a cancelled one is. A model whose
caches cannot be merged into a batch, and every model with batching turned off, runs each request
alone as a task on the same thread: one at a time, in arrival order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from swama.engine.decisions.decide import DecisionRun, launch_across, pick_rows
from swama.engine.errors import Cancelled, ContextTooLong, EngineError, Failed, Unavailable
from swama.engine.model import LoadedModel
from swama.engine.runtime import on_gpu
from swama.engine.serving.prompt_cache import PromptCache, cacheable
from swama.engine.serving.threads import THREADS, in_thread
from swama.engine.settings import CPU_PREFILL_STEP, GPU_PREFILL_STEP, default_of
from swama.engine.text.generator import (
    ChatRequest,
    Decoder,
    Event,
    generate,
    make_sampling,
    prepare,
    token_budget,
)

log = logging.getLogger("swama.scheduler")
T = TypeVar("T")
_DONE = object()
DECISION_ROWS = 16  # decision questions scored in one batched pass between batch steps, at least


def default_prefill_step() -> int:
    """Prompt tokens read per step when --prefill-step is not given: the device's (engine/settings.py)."""
    return GPU_PREFILL_STEP if on_gpu() else CPU_PREFILL_STEP


def batchable(model: LoadedModel) -> bool:
    """Whether the model's caches merge into a batch (mlx-lm's test): attention, sliding-window and
    recurrent layers all do; a vision model's language view is served alone."""
    from mlx_lm.models.cache import make_prompt_cache

    return model.vision is None and all(hasattr(c, "merge") for c in make_prompt_cache(model.model))


@dataclass(eq=False)
class _Job:
    request: ChatRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)  # client gone, or a stop sequence met
    submitted: float = field(default_factory=time.perf_counter)
    ids: list[int] = field(default_factory=list)  # the rendered prompt
    decoder: Decoder | None = None  # used on one thread only: the event loop's or the scheduler's
    reused: int = 0
    ended: bool = False  # its last event is decoded

    def post(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def decode(self, token: int, finish_reason: str | None) -> list[Any]:
        """One generated token (and the generator's finish reason) into the items for the queue."""
        if self.ended:
            return []
        items: list[Any] = self.decoder.token(token)
        reason = self.decoder.finish_reason or finish_reason
        if reason is not None:
            self.ended = True
            if finish_reason is None:
                self.cancelled.set()  # a stop sequence: the scheduler takes the row out next turn
            items += self.decoder.finish(reason, self.reused)
            items.append(_DONE)
        return items


def _put(decoded: list[tuple[_Job, list[Any]]]) -> None:
    """On the event loop: a step's decoded items into their jobs' queues."""
    for job, items in decoded:
        for item in items:
            job.queue.put_nowait(item)


def _decode_and_put(tokens: list[tuple[_Job, int, str | None]]) -> None:
    """On the event loop: a step's tokens decoded, then into their jobs' queues."""
    _put([(job, job.decode(token, finish_reason)) for job, token, finish_reason in tokens])


class Scheduler:
    def __init__(self, model: LoadedModel, *, prompt_cache: PromptCache | None, batching: bool = True,
                 rows: int | None = None, prefill_step: int | None = None,
                 profile_dir: Path | None = None) -> None:
        self.model = model
        self.profile_dir = profile_dir
        self.prompt_cache = prompt_cache
        self.batching = batching and batchable(model)
        self.rows = (rows or default_of("batch_rows")) if self.batching else 1
        self.prefill_step = prefill_step or default_prefill_step()
        # A device given more rows to generate for takes as many decision questions in one pass.
        self.decision_rows = max(DECISION_ROWS, rows or default_of("batch_rows"))
        # Tokens become text on the event loop on a GPU, so the thread that drives it does no text
        # work; on the CPU, whose cores are the device, on this thread between steps (text work
        # running beside a step only takes a core from it).
        self.decode_on_loop = on_gpu()
        self._wake = threading.Condition()
        self._new: deque[_Job] = deque()
        self._tasks: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self._active: dict[int, _Job] = {}
        self._decisions: list[tuple[DecisionRun, concurrent.futures.Future[None]]] = []
        self._in_flight: Any = None  # the decision pass launched last turn, finished this turn
        self.decision_passes = 0  # batched passes that scored decision questions
        self._closed = False
        self._gen: Any = None
        self._eos: Any = None
        self._thread: threading.Thread | None = None  # the thread running the loop, once it runs
        self._stopped = THREADS.submit(self._loop, "swama-scheduler")

    # -- the event loop's side ---------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        """Events of one generation; stop iterating (or `aclose()`) to cancel it."""
        job = _Job(request, asyncio.get_running_loop())
        if not self.batching:
            job_done = self.call(lambda: self._alone(job))
        else:
            job.ids = (await in_thread(lambda: prepare(self.model, request))).ids
            job.decoder = Decoder(self.model, request, len(job.ids))
            job.decoder.started = job.submitted  # time to first token counts the preparation and the wait for a row
            self._submit(lambda: self._new.append(job))
        try:
            while True:
                item = await job.queue.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            job.cancelled.set()
            self._submit(lambda: None)
            if not self.batching:
                # The request's task may still be queued: it sees the cancel and does nothing.
                await asyncio.shield(asyncio.wrap_future(job_done))

    def call(self, step: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `step` on the scheduler's thread between batch steps; await it with `asyncio.wrap_future`."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._submit(lambda: self._tasks.append((step, future)))
        return future

    async def run(self, step: Callable[[], T]) -> T:
        """`call`, awaited. A caller that is cancelled still waits for a step already running."""
        future = self.call(step)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            if not future.cancel():
                await asyncio.wait({asyncio.wrap_future(future)})
            raise

    async def score(self, run: DecisionRun) -> None:
        """Score the remaining questions of a started run whose prefix sits in plain KV caches,
        in batched passes shared with the other decision requests on this model."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._submit(lambda: self._decisions.append((run, future)))
        try:
            await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            future.cancel()  # the client went away: its questions leave the next pass
            raise

    def close(self, timeout: float = 10.0) -> None:
        """Stop the loop once its current step is done; its thread is parked for the next scheduler."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if threading.current_thread() is not self._thread:
            concurrent.futures.wait([self._stopped], timeout)

    def _submit(self, change: Callable[[], None]) -> None:
        with self._wake:
            if self._closed:
                raise Unavailable(f"Model '{self.model.id}' is being unloaded; retry.", code="model_unloading")
            change()
            self._wake.notify()

    # -- the scheduler thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        if self.profile_dir is None:
            return self._serve()
        import cProfile

        profile = cProfile.Profile()
        try:
            profile.runcall(self._serve)
        finally:
            self.profile_dir.mkdir(parents=True, exist_ok=True)
            name = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.model.id)
            profile.dump_stats(self.profile_dir / f"scheduler-{name}-{os.getpid()}-{time.time_ns()}.prof")
            log.info("scheduler profile of %s written to %s", self.model.id, self.profile_dir)

    def _serve(self) -> None:
        import mlx.core as mx

        self._thread = threading.current_thread()
        # The thread's own stream: all of this model's work runs in order on it.
        stream = mx.default_stream(mx.default_device())
        while True:
            with self._wake:
                while not (self._closed or self._new or self._tasks or self._active or self._decisions
                           or self._in_flight is not None):
                    self._wake.wait()
                if self._closed:
                    break
                new = list(self._new)
                self._new.clear()
                task = self._tasks.popleft() if self._tasks else None
            with mx.stream(stream):
                for job in new:
                    self._insert(job, stream)
                self._drop_cancelled()
                if task is not None:
                    self._run_task(*task)
                if self._decisions or self._in_flight is not None:
                    self._decision_pass()
                if self._active:
                    try:
                        self._step()
                    except Exception as exc:  # the whole batch failed: answer every row, start afresh
                        log.exception("batch step failed on %s", self.model.id)
                        self._fail_all(Failed(f"Generation failed: {exc}", code="generation_failed"))
                    if not self._active:
                        mx.clear_cache()  # idle again: hand the freed buffers back to the system
        unloaded = Unavailable(f"Model '{self.model.id}' was unloaded; retry.", code="model_unloading")
        self._fail_all(unloaded)
        for _, future in self._tasks:
            future.cancel()
        for _, future in list(self._decisions):
            self._settle(future, unloaded)
        self._in_flight = None
        if self._gen is not None:
            self._gen.close()

    @staticmethod
    def _run_task(step: Callable[[], Any], future: concurrent.futures.Future[Any]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(step())
        except BaseException as exc:
            future.set_exception(exc)

    def _decision_pass(self) -> None:
        """Launch the next batched pass, then finish the one launched last turn: the device always
        has the next pass queued while the host turns the last one into answers."""
        with self._wake:
            self._decisions = [(r, f) for r, f in self._decisions if not f.done()]
            waiting = list(self._decisions)
        futures = {id(run): future for run, future in waiting}
        launched = None
        rows = pick_rows([run for run, _ in waiting], self.decision_rows) if waiting else []
        if rows:
            try:
                launched = (rows, launch_across(rows), futures)
            except Exception as exc:  # the pass failed: every request in it gets the error
                for run in {id(r): r for r, _ in rows}.values():
                    self._settle(futures[id(run)], exc)
        if self._in_flight is not None:
            self._finish_pass(*self._in_flight)
        self._in_flight = launched

    def _finish_pass(self, rows: list[tuple[DecisionRun, Any]], pending: Any,
                     futures: dict[int, concurrent.futures.Future[None]]) -> None:
        try:
            reduced = pending.rows()
        except Exception as exc:  # the pass failed: every request in it gets the error
            for run in {id(r): r for r, _ in rows}.values():
                self._settle(futures[id(run)], exc)
            return
        self.decision_passes += 1
        for (run, q), row in zip(rows, reduced, strict=True):
            future = futures[id(run)]
            if future.done():  # refused, failed or gone: the rest of its answers are not needed
                continue
            try:
                run.accept(q, row)
            except Exception as exc:  # this request's refusal (a reasoning opener): only it fails
                self._settle(future, exc)
                continue
            if run.done:
                self._settle(future, None)

    def _settle(self, future: concurrent.futures.Future[None], error: BaseException | None) -> None:
        with self._wake:
            self._decisions = [(r, f) for r, f in self._decisions if f is not future]
        if future.set_running_or_notify_cancel():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def _alone(self, job: _Job) -> None:
        """A request served by itself (no batching), start to end, on this thread."""
        if job.cancelled.is_set():
            job.post(_DONE)
            return
        try:
            for event in generate(self.model, job.request, job.cancelled):
                job.post(event)
            job.post(_DONE)
        except Cancelled:
            job.post(_DONE)
        except Exception as exc:
            job.post(exc)

    def _generator(self, stream: Any) -> Any:
        from mlx_lm.generate import BatchGenerator, StopSequences

        if self._gen is None:
            self._gen = BatchGenerator(self.model.model, completion_batch_size=self.rows,
                                       prefill_batch_size=min(8, self.rows), prefill_step_size=self.prefill_step,
                                       stream=stream)
            self._eos = StopSequences([[t] for t in sorted(self.model.eos_ids)])
        return self._gen

    def _insert(self, job: _Job, stream: Any) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        if job.cancelled.is_set():
            job.post(_DONE)
            return
        try:
            ids = job.ids
            budget = token_budget(job.request, len(ids))
            if budget <= 0:
                raise ContextTooLong(f"The prompt ({len(ids)} tokens) leaves no room to generate in the context "
                                     f"window of {job.request.effective_context_limit} tokens.")
            sampler, processors = make_sampling(self.model, job.request.sampling)
            cache, job.reused = self.prompt_cache.take(ids) if self.prompt_cache is not None else (None, 0)
            gen = self._generator(stream)
            [uid] = gen.insert([ids[job.reused:]], max_tokens=[budget],
                               caches=[cache or make_prompt_cache(self.model.model)],
                               all_tokens=[list(ids[:job.reused])], samplers=[sampler],
                               logits_processors=[processors], stop_sequences=[self._eos])
        except Exception as exc:
            job.post(exc)
            return
        self._active[uid] = job

    def _keep(self, kept: tuple[list[Any], list[int]] | None) -> None:
        """Give a finished row's key/value state to the prompt cache."""
        if kept is None or self.prompt_cache is None:
            return
        cache, tokens = kept
        if cache and cacheable(cache):
            self.prompt_cache.put(list(tokens)[: cache[0].offset], cache)

    def _remove(self, uid: int) -> None:
        kept = self._gen.remove([uid], return_prompt_caches=True).get(uid)
        self._active.pop(uid, None)
        self._keep(kept)

    def _drop_cancelled(self) -> None:
        for uid in [u for u, job in self._active.items() if job.cancelled.is_set()]:
            self._remove(uid)  # its client is gone: nothing more is sent

    def _step(self) -> None:
        _, responses = self._gen.next()
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for r in responses:
            job = self._active.get(r.uid)
            if job is None:
                continue
            token = int(r.token)
            item = (job, token, r.finish_reason) if self.decode_on_loop else (job, job.decode(token, r.finish_reason))
            by_loop.setdefault(job.loop, []).append(item)
            if r.finish_reason is not None:  # end of sequence or max tokens: the row has left the batch
                self._active.pop(r.uid)
                self._keep((r.prompt_cache, r.all_tokens))
        deliver = _decode_and_put if self.decode_on_loop else _put
        for loop, items in by_loop.items():  # one wake-up of each event loop per step
            loop.call_soon_threadsafe(deliver, items)

    def _fail_all(self, error: EngineError) -> None:
        for job in self._active.values():
            job.post(error)
        self._active.clear()
        for job in self._new:
            job.post(error)
        self._new.clear()
        if self._gen is not None:
            self._gen.close()
            self._gen = None
