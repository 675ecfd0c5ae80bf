"""The batch scheduler: one thread per loaded language model that owns all of that model's MLX work.

Chat and responses requests join one continuous batch (mlx-lm's `BatchGenerator`) and leave it when
they finish, between steps. Each turn of the loop:

1. new requests, whose prompts were rendered and tokenized on a worker thread before they were
   submitted, are inserted (token budget, sampler), resuming from the prompt cache's longest
   matching prefix;
2. rows whose client went away are removed, and their key/value state goes back to the prompt cache;
3. one queued task runs; the shared prefixes of the decision requests waiting to start are read
   together in one packed forward (engine/decisions/packed_prefill.py: requests of similar prefix
   lengths, within a token budget); then one batched pass is launched on the pending questions of
   every decision request waiting on the model (up to `decision_rows` rows: the device's
   `DECISION_ROWS` or `GPU_DECISION_ROWS`, or `--batch-rows` when that is larger; whole requests
   on a GPU, round robin over the requests on the CPU), and the pass launched last turn is read
   back into answers while the new one computes;
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

A model split across ranks (engine/ranks/) has one scheduler per rank. Rank 0's runs the loop above
and, before each turn's forward passes, shares what the turn holds (`Turn`: requests joining with
their tokens and sampling seeds, rows leaving, decision work); the other ranks' schedulers run
`_follow`, which applies each shared turn to the same batch, prompt cache and decision runs, so every
rank runs the same forward passes. A failure of the group ends every request in flight with a 503.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from swama.engine.decisions.decide import DecisionRun, launch_across, pick_rows
from swama.engine.decisions.packed_prefill import pack_tokens, pick_pack, prefill_pack, width_step
from swama.engine.errors import Cancelled, ContextTooLong, EngineError, Failed, Unavailable
from swama.engine.kinds.vision import vision_of
from swama.engine.model import LoadedModel
from swama.engine.priority import live_first
from swama.engine.ranks.group import HEARTBEAT, GroupFailed, RankGroup, group_of
from swama.engine.runtime import compute_dtype, on_gpu
from swama.engine.serving.admission import ALIGN, Admission, Pending
from swama.engine.serving.memory import gib
from swama.engine.serving.siblings import Siblings
from swama.engine.serving.threads import THREADS, in_thread
from swama.engine.serving.timing import TimedForward, TurnClock
from swama.engine.serving.turn import DecisionBatch, DecisionPrefill, Insert, PromptScore, Turn
from swama.engine.settings import (
    CPU_PREFILL_STEP,
    CPU_PREFILL_WAIT,
    GPU_PREFILL_STEP,
    GPU_PREFILL_WAIT,
    default_of,
)
from swama.engine.speculative.policy import Speculation, for_device
from swama.engine.text.chat_prompt import Prompt
from swama.engine.text.generator import (
    ChatRequest,
    Decoder,
    Event,
    constraint_processors,
    generate,
    make_sampling,
    ordered,
    prepare,
    quick_to_prepare,
    row_processors,
    token_budget,
)
from swama.engine.text.kv_policy import kv_quant_of
from swama.engine.text.kv_quant import as_quantized, kv_token_bytes
from swama.engine.text.logprobs import Recorder, TokenLogprob, prompt_logprobs, token_bytes
from swama.engine.text.prompt_cache import PromptCache, cacheable, prefix_copy

Mirror = DecisionPrefill | DecisionBatch | PromptScore  # a task as the other ranks of a group run it

log = logging.getLogger("swama.scheduler")
T = TypeVar("T")
_DONE = object()
DECISION_ROWS = 16  # decision questions scored in one batched pass between batch steps, at least
GPU_DECISION_ROWS = 512  # on a GPU, whose passes take whole requests (decide.pick_rows)


def default_prefill_step() -> int:
    """Prompt tokens read per step when --prefill-step is not given: the device's (engine/settings.py)."""
    return GPU_PREFILL_STEP if on_gpu() else CPU_PREFILL_STEP


def default_prefill_wait() -> int:
    """Decode steps a new prompt may wait for others when --prefill-wait is not given: the device's."""
    return GPU_PREFILL_WAIT if on_gpu() else CPU_PREFILL_WAIT


def batchable(model: LoadedModel) -> bool:
    """Whether the model's caches merge into a batch (mlx-lm's test): attention, sliding-window and
    recurrent layers all do; a vision model's language view is served alone."""
    from mlx_lm.models.cache import make_prompt_cache

    return vision_of(model) is None and all(hasattr(c, "merge") for c in make_prompt_cache(model.model))


@dataclass(eq=False)
class _Job:
    request: ChatRequest
    sink: Sink  # where its tokens, its error or its end go
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)  # its events, when they go to an event loop here
    cancelled: threading.Event = field(default_factory=threading.Event)  # client gone, or a stop sequence met
    submitted: float = field(default_factory=time.perf_counter)
    ids: list[int] = field(default_factory=list)  # the rendered prompt
    decoder: Decoder | None = None  # used on one thread only: the event loop's or the scheduler's
    processors: list[Any] = field(default_factory=list)  # its log-probability recorder, its output mask
    recorder: Recorder | None = None  # log probabilities, read on the scheduler's thread
    table: Any = None  # the model's token bytes, for the recorder
    reused: int = 0
    from_disk: int = 0  # of the reused tokens, those read from the prompt cache's disk tier
    ended: bool = False  # its last event is decoded
    cid: int = 0  # its number on the engine process's channel

    def post(self, item: Any) -> None:
        self.sink.post(self, item)

    def read(self, token: int) -> TokenLogprob | None:
        """The log probabilities of `token`, on the scheduler's thread (None when not asked)."""
        return self.recorder.take(token, self.table) if self.recorder is not None else None

    def decode(self, token: int, finish_reason: str | None, reading: Any = None, drafted: int = 0) -> list[Any]:
        """One generated token (its log probabilities when asked, the draft tokens accepted so far and
        the generator's finish reason) into the items for the queue."""
        if self.ended:
            return []
        self.decoder.drafted = drafted
        items, self.ended = self.decoder.step(token, finish_reason, reading, self.reused, self.from_disk)
        if self.ended:
            if finish_reason is None:
                self.cancelled.set()  # a stop sequence: the scheduler takes the row out next turn
            items.append(_DONE)
        return items


class Sink(Protocol):
    """Where a job's tokens go: to an event loop of this process, or over the engine process's channel."""

    def post(self, job: _Job, item: Any) -> None:
        """The job's error or its end (`_DONE`), from any thread."""

    def deliver(self, tokens: list[tuple[_Job, int, str | None, Any, int]]) -> None:
        """A step's tokens (job, token, finish reason, log probabilities, draft tokens accepted so far), on
        the scheduler's thread."""


class LoopSink:
    """Jobs of one event loop: their tokens become events there (a GPU: the thread that drives it does
    no text work), or on the scheduler's thread (the CPU, whose cores are the device: text work
    beside a step only takes a core from it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, decode_here: bool) -> None:
        self.loop = loop
        self.decode_here = decode_here

    def post(self, job: _Job, item: Any) -> None:
        self.loop.call_soon_threadsafe(job.queue.put_nowait, item)

    def deliver(self, tokens: list[tuple[_Job, int, str | None, Any, int]]) -> None:
        if self.decode_here:
            self.loop.call_soon_threadsafe(_put, [(job, job.decode(*rest)) for job, *rest in tokens])
        else:
            self.loop.call_soon_threadsafe(_decode_and_put, tokens)


def _put(decoded: list[tuple[_Job, list[Any]]]) -> None:
    """On the event loop: a step's decoded items into their jobs' queues."""
    for job, items in decoded:
        for item in items:
            job.queue.put_nowait(item)


def _resolve(future: concurrent.futures.Future[Any], error: BaseException | None, result: Any = None) -> None:
    """Settle a running task's future, unless a failed rank group already answered it."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass


def _quietly(work: Callable[[], Any]) -> None:
    """Decision work on a rank that answers no one: a request's refusal is rank 0's to send."""
    try:
        work()
    except EngineError:
        pass


def _prefill(run: DecisionRun) -> None:
    """A run's prefix prefill, after the model's head split is settled: that check runs forward
    passes once per model, which on a model split across ranks must come at the same step on every
    rank (here, in the turn of a model's first decision request), not when rank 0 first plans a pass."""
    _ = run.split
    run.prefill()


def _index(run: DecisionRun, question: Any) -> int:
    """Where a question sits in its run (by identity: two questions may be equal)."""
    return next(i for i, q in enumerate(run.prepared) if q is question)


def _decode_and_put(tokens: list[tuple[_Job, int, str | None, Any, int]]) -> None:
    """On the event loop: a step's tokens decoded, then into their jobs' queues."""
    _put([(job, job.decode(*rest)) for job, *rest in tokens])


class Scheduler:
    def __init__(self, model: LoadedModel, *, prompt_cache: PromptCache | None, batching: bool = True,
                 rows: int | None = None, prefill_step: int | None = None, prefill_wait: int | None = None,
                 profile_dir: Path | None = None, speculation: Speculation | None = None,
                 draft: LoadedModel | None = None, compiled_step: str | None = None,
                 kv_budget: int | None = None) -> None:
        self.model = model
        self.compiled_step = compiled_step or default_of("compiled_step")
        # LoRA adapters may run on this model (engine/adapters/): its batch takes mlx-lm's forward, whose
        # layers add them; the compiled step's fused projections would not.
        self.adapters = False
        self.group: RankGroup | None = group_of(model)
        self.speculation = for_device(speculation or Speculation(), on_gpu())
        self.kv = kv_quant_of(model)  # quantized key/value caches (--kv-bits), None at full precision
        # Key/value room (from --memory-limit): each row reserves its prompt and the tokens it may
        # generate at the bytes a token takes (quantized ones with --kv-bits); a request that does not
        # fit beside the rows running waits for them, in arrival order. None: rows are not counted.
        self.kv_token_bytes = kv_token_bytes(model.model, compute_dtype().size, self.kv) if kv_budget is not None else None
        self.kv_budget = kv_budget if self.kv_token_bytes is not None else None
        self._reserved: dict[int, int] = {}  # bytes each row reserves, by row id
        self._held: deque[_Job] = deque()  # requests waiting for key/value room
        if self.kv is not None and self.kv.after > 0 and self.speculation.on:
            # Drafting's row caches (engine/speculative/row_cache.py) are quantized from their first token or
            # never: a batch that turns quantized midway decodes plainly.
            log.info("%s: --kv-quantize-after decodes without drafting", model.id)
            self.speculation = dataclasses.replace(self.speculation, mode="off")
        self.draft = draft if self.group is None else None  # ranks draft by prompt lookup alone
        if self.group is not None:  # every rank must choose the same pass widths: from the prior, not timings
            self.speculation = dataclasses.replace(self.speculation, measured=False)
        if self.group is not None and not (batching and batchable(model)):
            raise ValueError("a model split across ranks is served by the batch scheduler (batching on)")
        self.profile_dir = profile_dir
        self.prompt_cache = prompt_cache
        self.batching = batching and batchable(model)
        self.rows = (rows or default_of("batch_rows")) if self.batching else 1
        self.prefill_step = prefill_step or default_prefill_step()
        self.prefill_wait = default_prefill_wait() if prefill_wait is None else prefill_wait
        # A device given more rows to generate for takes as many decision questions in one pass.
        self.decision_rows = max(GPU_DECISION_ROWS if on_gpu() else DECISION_ROWS, rows or default_of("batch_rows"))
        # Tokens become text on the event loop on a GPU, so the thread that drives it does no text
        # work; on the CPU, whose cores are the device, on this thread between steps (text work
        # running beside a step only takes a core from it).
        self.decode_on_loop = on_gpu()
        self._sinks: dict[asyncio.AbstractEventLoop, LoopSink] = {}
        self._wake = threading.Condition()
        self._new: deque[_Job] = deque()
        self._siblings: Siblings[_Job] = Siblings(lambda job: job.request.siblings)  # choices of one request
        self._tasks: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any], Mirror | None]] = deque()
        self._active: dict[int, _Job | None] = {}  # by row id (None: another rank's request, when following)
        self._uid_of: dict[int, int] = {}  # a row's uid in the generation batch, once its prompt is read
        self._rid_of: dict[int, int] = {}
        # Rows with a LoRA adapter (engine/adapters/), by uid: the bank slot each forward selects for them,
        # and the adapter's id that keys their cache in the prompt cache.
        self._slot_of: dict[int, int] = {}
        self._salt_of: dict[int, str] = {}
        self._rids = 0
        self._admission: Admission | None = None
        # Prefill shapes from a small set on a GPU, where each new shape's attention graph is built
        # with the device idle (engine/serving/admission.py).
        self.bucketed = on_gpu()
        self.clock = TurnClock()
        self._decisions: list[tuple[DecisionRun, concurrent.futures.Future[None]]] = []
        self._prefills: list[tuple[DecisionRun, concurrent.futures.Future[None]]] = []  # runs waiting for a pack
        self._in_flight: Any = None  # the decision pass launched last turn, finished this turn
        self.decision_passes = 0  # batched passes that scored decision questions
        self.decision_packs = 0  # forwards that read the prefixes of decision requests together
        self._closed = False
        self._failed: EngineError | None = None  # the rank group failed: every request gets this
        self._gen: Any = None
        self._eos: Any = None
        # Ranks: decision runs by the key the turns name them with, runs ended since the last turn,
        # and a checksum of the tokens sampled in the last step (the ranks compare theirs).
        self._runs: dict[int, DecisionRun] = {}
        self._keys = 0
        self._forget: list[int] = []
        self._checksum = 0
        self._joined: list[tuple[int, int]] = []  # rank 0: this turn's prompts that joined (rid, tokens resumed)
        # finished rows' caches (with their adapter's id) on their way to the prompt cache
        self._keeping: list[tuple[list[Any], list[int], str | None]] = []
        self._running: concurrent.futures.Future[Any] | None = None  # the task running now
        self._thread: threading.Thread | None = None  # the thread running the loop, once it runs
        following = self.group is not None and self.group.rank != 0
        if self.group is not None and not following:
            self.group.on_failure(self._group_failed)
        self._stopped = THREADS.submit(self._follow if following else self._loop, "swama-scheduler")

    # -- the event loop's side ---------------------------------------------------------------------

    async def generate(self, request: ChatRequest) -> AsyncIterator[Event]:
        """Events of one generation; stop iterating (or `aclose()`) to cancel it."""
        loop = asyncio.get_running_loop()
        sink = self._sinks.get(loop) or self._sinks.setdefault(loop, LoopSink(loop, not self.decode_on_loop))
        job = _Job(request, sink)
        if not self.batching:
            job_done = self.call(lambda: self._alone(job))
        else:
            def ready() -> None:  # rendering, tokenizing and compiling a grammar
                prompt = prepare(self.model, request)
                job.ids = prompt.ids
                job.processors, job.recorder = row_processors(self.model, request, prompt)
                job.table = token_bytes(self.model) if job.recorder is not None else None
                job.decoder = Decoder(self.model, request, len(job.ids), job.recorder, prompt.opens_thinking)

            if quick_to_prepare(request):
                ready()
            else:
                await in_thread(ready)
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

    def submit_tokens(self, ids: list[int], request: ChatRequest, opens_thinking: bool, sink: Sink, cid: int) -> _Job:
        """A prompt a front end already rendered and tokenized, into the batch; its tokens, its error
        or its end go to `sink` under `cid`. Its logits processors are made here (a grammar compiles):
        call it off the event loop."""
        if not self.batching:
            raise ValueError("tokens stream from the batch scheduler (batching on)")
        job = _Job(request, sink, ids=ids, cid=cid)
        job.processors, job.recorder = row_processors(self.model, request, Prompt(ids, "", opens_thinking=opens_thinking))
        job.table = token_bytes(self.model) if job.recorder is not None else None
        self._submit(lambda: self._new.append(job))
        return job

    def cancel(self, job: _Job) -> None:
        """The job's client is gone (or its front end met a stop sequence): its row leaves at the next turn."""
        job.cancelled.set()
        try:
            self._submit(lambda: None)
        except EngineError:  # the scheduler is closing: the row goes with it
            pass

    def call(self, step: Callable[[], T], mirror: Mirror | None = None) -> concurrent.futures.Future[T]:
        """Run `step` on the scheduler's thread between batch steps; await it with `asyncio.wrap_future`.
        On a model split across ranks, `mirror` is the same work as the other ranks run it."""
        if self.group is not None and mirror is None:
            raise ValueError("work on a model split across ranks needs its mirror for the other ranks")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._submit(lambda: self._tasks.append((step, future, mirror)))
        return future

    async def run(self, step: Callable[[], T], mirror: Mirror | None = None) -> T:
        """`call`, awaited. A caller that is cancelled still waits for a step already running."""
        future = self.call(step, mirror)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            if not future.cancel():
                await asyncio.wait({asyncio.wrap_future(future)})
            raise

    async def prefill(self, run: DecisionRun) -> None:
        """A prepared decision run's shared prefix into its cache, in one turn."""
        key = self._key(run)
        await self.run(lambda: _prefill(run), DecisionPrefill(key, run.job, run.prefix_reuse) if key is not None else None)

    async def score_batch(self, run: DecisionRun, max_rows: int) -> None:
        """A run's next `max_rows` questions in its own batched passes, in one turn."""
        key = self._runs_key(run)
        mirror = (DecisionBatch(key, max_rows, run.batch_logits_bytes, run.batch_cache_bytes)
                  if key is not None else None)
        await self.run(lambda: run.score_batch(max_rows=max_rows), mirror)

    def forget(self, run: DecisionRun) -> None:
        """A decision run ended: the other ranks drop their copy of it at the next turn."""
        key = self._runs_key(run)
        if key is not None:
            with self._wake:
                self._runs.pop(key, None)
                self._forget.append(key)

    def _key(self, run: DecisionRun) -> int | None:
        """A new run's key in the turns (None when the model is not split across ranks)."""
        if self.group is None:
            return None
        with self._wake:
            self._keys += 1
            run.key = self._keys
            self._runs[run.key] = run
        return run.key

    def _runs_key(self, run: DecisionRun) -> int | None:
        return run.key if self.group is not None else None

    async def score(self, run: DecisionRun) -> None:
        """Score the remaining questions of a started run whose prefix sits in plain KV caches,
        in batched passes shared with the other decision requests on this model."""
        await self._answered(run, self._decisions)

    async def decide(self, run: DecisionRun) -> None:
        """A prepared run whose prefix can be packed (packed_prefill.packable), on a model not split
        across ranks: its prefix read in a pack with the other runs waiting to start, then its
        questions scored in passes shared with every decision request on the model."""
        await self._answered(run, self._prefills)

    async def _answered(self, run: DecisionRun,
                        queue: list[tuple[DecisionRun, concurrent.futures.Future[None]]]) -> None:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._submit(lambda: queue.append((run, future)))
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

    def kv_bytes(self) -> int:
        """Bytes of key/value state the batch's rows hold now (read from another thread: an estimate)."""
        try:
            held = int(self._gen.prompt_cache_nbytes) if self._gen is not None else 0
            return held + (self._admission.nbytes if self._admission is not None else 0)
        except Exception:  # the batch changed while it was read
            return 0

    def join(self) -> None:
        """Wait until the loop has stopped (a following rank's loop stops only with its group)."""
        concurrent.futures.wait([self._stopped])

    def _submit(self, change: Callable[[], None]) -> None:
        with self._wake:
            if self._failed is not None:
                raise self._failed
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
        # Idle on a split model, rank 0 still shares an empty turn now and then: the others know it lives.
        idle_wait = HEARTBEAT if self.group is not None else None
        while True:
            with self._wake:
                self.clock.wait()
                while not (self._closed or self._failed or self._new or self._tasks or self._active or self._held
                           or self._decisions or self._prefills or self._in_flight is not None):
                    if not self._wake.wait(self._siblings.wait(idle_wait)):
                        break
                self.clock.woke()
                if self._closed or self._failed:
                    break
                # Those waiting for key/value room first; a request's choices only once all have come.
                new = [*self._held, *self._siblings.admit(self._new)]
                self._new.clear()
                self._held.clear()
                task = self._tasks.popleft() if self._tasks else None
                pack = self._take_pack() if self._prefills else []
                forget, self._forget = self._forget, []
            self.clock.turns += 1
            self._joined = []
            with mx.stream(stream):
                turn = Turn(forget=forget) if self.group is not None else None
                with self.clock.part("admission"):
                    held = False
                    for job in new:
                        held = self._insert(job, stream, turn, held)
                    self._drop_cancelled(turn)
                if task is not None and not task[1].set_running_or_notify_cancel():
                    task = None  # its caller went away before it started
                # With a pack to read, the pass is picked after it: its runs join this turn's pass.
                waiting = not pack and (self._decisions or self._in_flight is not None)
                picked = self._pick_pass() if waiting else None
                if turn is not None and not self._share(turn, task, picked):
                    break
                try:
                    if turn is not None:
                        self._agree_on_resumes(self._joined)
                    self._turn(task, picked, pack)
                except GroupFailed as exc:
                    self.group.fail(str(exc))
                    break
        error = self._failed or Unavailable(f"Model '{self.model.id}' was unloaded; retry.", code="model_unloading")
        self._fail_all(error)
        for _, future, _ in self._tasks:
            future.cancel()
        for _, future in [*self._decisions, *self._prefills]:
            self._settle(future, error)
        self._prefills = []
        self._in_flight = None
        if self._gen is not None:
            self._gen.close()

    def _turn(self, task: tuple[Callable[[], Any], concurrent.futures.Future[Any], Mirror | None] | None,
              picked: tuple[list[Any], dict[int, Any]] | None,
              pack: list[tuple[DecisionRun, concurrent.futures.Future[None]]] | None = None) -> None:
        """A turn's device work: the task, the decision prefixes, the decision pass, the batch step."""
        import mlx.core as mx

        if task is not None:
            with self.clock.part("tasks"):
                self._run_task(task[0], task[1])
        if pack:
            with self.clock.part("decisions"):
                self._prefill_pack(pack)
            if self._decisions or self._in_flight is not None:
                picked = self._pick_pass()
        if picked is not None:
            with self.clock.part("decisions"):
                self._decision_pass(*picked)
        if self._active:
            try:
                self._advance()
            except Exception as exc:  # the whole batch failed: answer every row, start afresh
                self._per_request(exc)
                log.exception("batch step failed on %s", self.model.id)
                self._fail_all(Failed(f"Generation failed: {exc}", code="generation_failed"))
            if not self._active:
                mx.clear_cache()  # idle again: hand the freed buffers back to the system
        if self.group is not None:
            self.group.end_step()

    def _advance(self) -> None:
        """The batch's device work of a turn: one prefill forward over waiting prompts, one decode step."""
        self._admit_ready()
        if self._uid_of:
            self._step()
        if not self._active:
            self._kept()  # no step follows to hand over the caches the last one copied out

    def _per_request(self, exc: BaseException) -> None:
        """Let `exc` go to the requests it concerns; on a split model only the engine's own errors
        do: anything else may be a collective that failed, so the group fails (GroupFailed)."""
        if self.group is not None and (not isinstance(exc, EngineError) or isinstance(exc, GroupFailed)):
            raise GroupFailed(f"rank {self.group.rank} failed a step: {type(exc).__name__}: {exc}") from exc

    def _share(self, turn: Turn, task: tuple[Any, Any, Mirror | None] | None,
               picked: tuple[list[Any], dict[int, Any]] | None) -> bool:
        """Rank 0: the turn to every rank before its forward passes; False when the group failed."""
        turn.task = task[2] if task is not None else None
        if picked is not None:
            turn.decision_rows = [(run.key, _index(run, q)) for run, q in picked[0]]
        try:
            self.group.share(turn.encode(), self._checksum)
        except GroupFailed as exc:
            if task is not None:
                task[1].set_exception(Unavailable(str(exc), code="rank_failed"))
            self.group.fail(str(exc))
            return False
        self.group.begin_step()
        return True

    def _group_failed(self, reason: str) -> None:
        """Rank 0, on any thread: every request on the model ends with a 503 (the group restarts)."""
        error = Unavailable(f"The ranks serving model '{self.model.id}' failed ({reason}); the group is being "
                            "restarted, retry shortly.", code="rank_failed")
        with self._wake:
            self._failed = error
            jobs = [j for j in (*self._active.values(), *self._new, *self._siblings.held()) if j is not None]
            futures = [f for _, f in self._decisions] + [f for _, f, _ in self._tasks]
            if self._running is not None:
                futures.append(self._running)
            self._wake.notify()
        for job in jobs:
            job.post(error)
        for future in futures:
            if not future.done() and (future.running() or future.set_running_or_notify_cancel()):
                try:
                    future.set_exception(error)
                except concurrent.futures.InvalidStateError:  # finished meanwhile
                    pass

    def _run_task(self, step: Callable[[], Any], future: concurrent.futures.Future[Any]) -> None:
        """A task whose future is already running (`set_running_or_notify_cancel`)."""
        self._running = future
        try:
            result = step()
        except BaseException as exc:
            _resolve(future, exc)
            self._per_request(exc)
        else:
            _resolve(future, None, result)
        finally:
            self._running = None

    def _take_pack(self) -> list[tuple[DecisionRun, concurrent.futures.Future[None]]]:
        """Under the lock: the runs whose prefixes are read together this turn, out of the queue."""
        self._prefills = [(r, f) for r, f in self._prefills if not f.done()]  # gone before they started
        if not self._prefills:
            return []
        self._prefills = live_first(self._prefills, lambda item: item[0].job.batch)
        runs = pick_pack([r for r, _ in self._prefills], pack_tokens(), width_step(), powers=self.bucketed)
        chosen = {id(r) for r in runs}
        pack = [(r, f) for r, f in self._prefills if id(r) in chosen]
        self._prefills = [(r, f) for r, f in self._prefills if id(r) not in chosen]
        return pack

    def _prefill_pack(self, pack: list[tuple[DecisionRun, concurrent.futures.Future[None]]]) -> None:
        """The pack's prefixes in one forward; its runs then wait for passes with the others."""
        try:
            prefill_pack([r for r, _ in pack], width_step())
        except Exception as exc:  # the forward failed: every request in it gets the error
            self._per_request(exc)
            for _, future in pack:
                self._settle(future, exc)
            return
        self.decision_packs += 1
        with self._wake:
            self._decisions += [(r, f) for r, f in pack if not f.done()]

    def _pick_pass(self) -> tuple[list[Any], dict[int, concurrent.futures.Future[None]]]:
        """The rows of the next batched decision pass (none while only last turn's pass is read back)."""
        with self._wake:
            self._decisions = [(r, f) for r, f in self._decisions if not f.done()]
            waiting = live_first(self._decisions, lambda item: item[0].job.batch)
        futures = {id(run): future for run, future in waiting}
        return (pick_rows([run for run, _ in waiting], self.decision_rows) if waiting else []), futures

    def _decision_pass(self, rows: list[tuple[DecisionRun, Any]],
                       futures: dict[int, concurrent.futures.Future[None]]) -> None:
        """Launch the next batched pass, then finish the one launched last turn: the device always
        has the next pass queued while the host turns the last one into answers."""
        launched = None
        if rows:
            try:
                launched = (rows, launch_across(rows), futures)
            except Exception as exc:  # the pass failed: every request in it gets the error
                self._per_request(exc)
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
            self._per_request(exc)
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

    # -- another rank's scheduler: the turns rank 0 shares ------------------------------------------

    def _follow(self) -> None:
        """Apply every turn rank 0 shares to this rank's copy of the batch, prompt cache and decision
        runs, so this rank runs the same forward passes; results are rank 0's to send."""
        import mlx.core as mx

        self._thread = threading.current_thread()
        stream = mx.default_stream(mx.default_device())
        with mx.stream(stream):
            while not self._closed and self.group.failed is None:
                try:
                    turn = Turn.decode(self.group.share(b"", self._checksum))
                    self.group.begin_step()
                    self._apply(turn, stream)
                    self.group.end_step()
                except GroupFailed as exc:
                    self.group.fail(str(exc))
                except Exception as exc:
                    log.exception("rank %d failed a step", self.group.rank)
                    self.group.fail(f"rank {self.group.rank} failed a step: {type(exc).__name__}: {exc}")

    def _apply(self, turn: Turn, stream: Any) -> None:
        import mlx.core as mx

        joined = []
        for ins in turn.inserts:
            rid, reused = self._join(ins.ids, ins.budget, ins.sampling, stream,
                                     constraint_processors(self.model, ins.constraint), ins.batch, ins.keep)
            self._active[rid] = None
            joined.append((rid, reused))
        self._agree_on_resumes(joined)
        for uid in turn.removals:
            self._remove(uid)
        for key in turn.forget:
            self._runs.pop(key, None)
        if isinstance(turn.task, DecisionPrefill):
            run = DecisionRun(self.model, turn.task.job, prefix_reuse=turn.task.prefix_reuse)
            self._runs[turn.task.key] = run
            run.prepare()
            _quietly(lambda: _prefill(run))
        elif isinstance(turn.task, DecisionBatch):
            run = self._runs[turn.task.key]
            run.batch_logits_bytes, run.batch_cache_bytes = turn.task.logits_bytes, turn.task.cache_bytes
            _quietly(lambda: run.score_batch(max_rows=turn.task.max_rows))
        elif isinstance(turn.task, PromptScore):
            task = turn.task
            _quietly(lambda: prompt_logprobs(self.model, task.ids, task.top, task.temperature))
        if turn.decision_rows is not None:
            rows = [(self._runs[k], self._runs[k].prepared[i]) for k, i in turn.decision_rows]
            launched = (rows, launch_across(rows)) if rows else None
            if self._in_flight is not None:
                done, pending = self._in_flight
                for (run, q), row in zip(done, pending.rows(), strict=True):
                    _quietly(lambda run=run, q=q, row=row: run.accept(q, row))
            self._in_flight = launched
        if self._active:
            self._advance()
            if not self._active:
                mx.clear_cache()

    def _settle(self, future: concurrent.futures.Future[None], error: BaseException | None) -> None:
        with self._wake:
            self._decisions = [(r, f) for r, f in self._decisions if f is not future]
        if future.done():  # already answered (a failed rank group answers every request at once)
            return
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
        from mlx_lm.generate import StopSequences

        from swama.engine.text.compiled_step.batch import SlotBatch
        from swama.engine.text.compiled_step.policy import decoder_for
        from swama.engine.text.decode_step import LeanGenerator

        if self._gen is None:
            # Prompts are read by the admission's batched prefill: each joins the generation batch with
            # its cache and only its last token, which the batch's first decode step feeds.
            model = TimedForward(self.model.model, self.clock)
            options = dict(completion_batch_size=self.rows, prefill_batch_size=self.rows,
                           prefill_step_size=self.prefill_step, stream=stream)
            if self.speculation.on:
                from swama.engine.speculative.batch import SpeculativeGenerator

                self._gen = SpeculativeGenerator(model, speculation=self.speculation, clock=self.clock,
                                                 draft_model=self.draft.model if self.draft else None, kv=self.kv,
                                                 **options)
            else:
                # The compiled step keeps its own full-precision storage: quantized caches take mlx-lm's forward.
                plain = self.group is None and self.kv is None and not self.adapters
                decoder = decoder_for(self.model, self.compiled_step, on_gpu()) if plain else None
                make_batch = functools.partial(SlotBatch.on, decoder) if decoder is not None else None
                self._gen = LeanGenerator(model, clock=self.clock, make_batch=make_batch, kv=self.kv, **options)
            self._gen.adapt(self.model, self._slot_of)
            self._eos = StopSequences([[t] for t in sorted(self.model.eos_ids)])
            self._admission = Admission(self.model.model, self.prefill_step, self.bucketed, max_rows=self.rows,
                                        wait=self.prefill_wait, kv=self.kv, loaded=self.model)
        return self._gen

    @property
    def compiled(self) -> bool:
        """Whether the generation batch runs the compiled decode step (fixed when the batch is made)."""
        from swama.engine.text.compiled_step.batch import SlotBatch

        return self._gen is not None and isinstance(getattr(self._gen, "_generation_batch", None), SlotBatch)

    def _insert(self, job: _Job, stream: Any, turn: Turn | None = None, held: bool = False) -> bool:
        """Queue a request's prompt for the batch; True when it waits for key/value room instead
        (`held`: one before it waits, so it does too)."""
        if job.cancelled.is_set():
            job.post(_DONE)
            return held
        try:
            ids = job.ids
            budget = token_budget(job.request, len(ids))
            if budget <= 0:
                raise ContextTooLong(f"The prompt ({len(ids)} tokens) leaves no room to generate in the context "
                                     f"window of {job.request.effective_context_limit} tokens.")
            need = self._room(len(ids), budget)
            if need and (held or sum(self._reserved.values()) + need > self.kv_budget):
                self._held.append(job)
                return True
            sampling = job.request.sampling
            if turn is not None and sampling.seed is None and sampling.temperature > 0:
                # Every rank samples the same tokens from the same logits only with one seed.
                sampling = dataclasses.replace(sampling, seed=secrets.randbits(63))
            rid, job.reused = self._join(ids, budget, sampling, stream, job.processors, job.request.batch,
                                         job.request.keep_prompt, job.request.adapter, job.request.adapter_slot)
            job.from_disk = self.prompt_cache.from_disk if self.prompt_cache is not None else 0
        except Exception as exc:
            job.post(exc)
            return held
        self._active[rid] = job
        if need:
            self._reserved[rid] = need
        if turn is not None:
            turn.inserts.append(Insert(ids, budget, sampling, job.request.constraint, job.request.batch,
                                       job.request.keep_prompt))
            self._joined.append((rid, job.reused))
        return held

    def _agree_on_resumes(self, joined: list[tuple[int, int]]) -> None:
        """On a split model with a prompt cache, after a turn's prompts joined (rid, tokens resumed):
        every rank resumes each prompt at the shortest prefix any rank resumed. Each rank reads its own
        blocks from disk, and one may hold fewer (still being written, evicted, damaged); a pipeline
        rank whose first layers are another's caches nothing. All ranks call this at the same point of
        the same turn: the gather is a collective."""
        if not joined or self.group is None or self.prompt_cache is None:
            return
        table = self.group.gather([reused for _, reused in joined])
        for (rid, reused), least in zip(joined, (min(column) for column in zip(*table, strict=True)), strict=True):
            if reused > least:
                self._resume_at(rid, least)

    def _resume_at(self, rid: int, n: int) -> None:
        """Prompt `rid`, still waiting to be read, resumed from its first `n` cached tokens only."""
        from mlx_lm.models.cache import make_prompt_cache

        row = self._admission.pending(rid)
        if row is None:  # its client went away in this turn
            return
        row.cache = as_quantized(prefix_copy(row.cache, n) if n else make_prompt_cache(self.model.model), self.kv)
        row.done = n
        job = self._active.get(rid)
        if job is not None:
            job.reused, job.from_disk = n, min(job.from_disk, n)

    def _room(self, prompt: int, budget: int) -> int:
        """Key/value bytes a row of `prompt` tokens that may generate `budget` more reserves (0: rows are
        not counted); ContextTooLong when it would not fit even alone."""
        if self.kv_budget is None:
            return 0
        need = (prompt + budget) * self.kv_token_bytes
        if need > self.kv_budget:
            fits = self.kv_budget // self.kv_token_bytes
            raise ContextTooLong(
                f"The prompt ({prompt} tokens) and the {budget} it may generate need {gib(need)} of key/value "
                f"memory; --memory-limit leaves this model {gib(self.kv_budget)}, {fits} tokens. Ask for fewer "
                "max_tokens, send a shorter prompt, or quantize the cache (--kv-bits).", code="context_limit_exceeded")
        return need

    def kv_reading(self) -> dict[str, int]:
        """The batch's key/value state now (read from another thread: an estimate): bytes its rows hold
        and reserve, the budget (0: rows are not counted), requests waiting for room, the bits (0: full)."""
        return {"bytes": self.kv_bytes(), "reserved": sum(list(self._reserved.values())),
                "budget": self.kv_budget or 0, "waiting": len(self._held), "bits": self.kv.bits if self.kv else 0}

    def _join(self, ids: list[int], budget: int, sampling: Any, stream: Any,
              extra: list[Any], batch: bool = False, keep: bool = False, adapter: str | None = None,
              slot: int = 0) -> tuple[int, int]:
        """A prompt queued for the batch's prefill, resumed from the prompt cache: its row id and the
        tokens reused. `adapter` and `slot`: its LoRA adapter's id and bank slot (None, 0: none)."""
        from mlx_lm.models.cache import make_prompt_cache

        sampler, processors = make_sampling(self.model, sampling)
        processors = ordered(processors, extra)
        multiple = ALIGN if self.bucketed else 1
        cache, reused = self.prompt_cache.take(ids, multiple, adapter) if self.prompt_cache is not None else (None, 0)
        if keep and self.prompt_cache is not None:
            self.prompt_cache.keep(ids)
        self._generator(stream)
        self._rids += 1
        cache = as_quantized(cache or make_prompt_cache(self.model.model), self.kv)
        self._admission.add(Pending(self._rids, ids, cache, reused,
                                    (budget, sampler, processors), batch=batch, slot=slot, salt=adapter))
        return self._rids, reused

    def _admit_ready(self) -> None:
        """One prefill forward over waiting prompts; the prompts it finished join the generation batch."""
        with self.clock.part("prefill"):
            ready = self._admission.step(decoding=bool(self._uid_of)) if self._admission is not None else []
        for group in ready:
            rows = group.rows
            budgets, samplers, processors = zip(*(row.extra for row in rows), strict=True)
            if group.batched:
                uids = self._gen.join_prefilled(group.cache, [r.ids[-1] for r in rows], [r.ids[:-1] for r in rows],
                                                list(samplers), list(processors), [self._eos] * len(rows),
                                                list(budgets))
            else:  # one prompt resumed whole from the prompt cache: its own cache, merged by mlx-lm
                [row] = rows
                uids = self._gen.insert([row.ids[-1:]], max_tokens=list(budgets), caches=[group.cache],
                                        all_tokens=[row.ids[:-1]], samplers=list(samplers),
                                        logits_processors=list(processors), stop_sequences=[self._eos])
            for row, uid in zip(rows, uids, strict=True):
                self._uid_of[row.rid], self._rid_of[uid] = uid, row.rid
                if row.slot:
                    self._slot_of[uid], self._salt_of[uid] = row.slot, row.salt

    def _keep(self, kept: tuple[list[Any], list[int]] | None, salt: str | None = None) -> None:
        """Give a finished row's key/value state to the prompt cache (`salt`: its adapter's id)."""
        if kept is None or self.prompt_cache is None:
            return
        cache, tokens = kept
        if cache and cacheable(cache):
            self.prompt_cache.put(list(tokens)[: cache[0].offset], cache, salt)

    def _unslot(self, uid: int) -> str | None:
        """A row leaving the batch: its adapter's id (None: none), its slot forgotten."""
        self._slot_of.pop(uid, None)
        return self._salt_of.pop(uid, None)

    def _drafted(self, uid: int, keep: bool = False) -> int:
        """Accepted draft tokens of a row so far (forgotten unless `keep`: the row is leaving)."""
        counters = getattr(self._gen, "counters", None)
        if counters is None:
            return 0
        return counters.by_uid.get(uid, 0) if keep else counters.by_uid.pop(uid, 0)

    def _remove(self, rid: int) -> None:
        self._active.pop(rid, None)
        self._reserved.pop(rid, None)
        uid = self._uid_of.pop(rid, None)
        if uid is None:  # still reading its prompt
            if self._admission is not None:
                self._admission.drop(rid)
            return
        del self._rid_of[uid]
        self._drafted(uid)
        salt = self._unslot(uid)
        self._keep(self._gen.remove([uid], return_prompt_caches=True).get(uid), salt)

    def _drop_cancelled(self, turn: Turn | None = None) -> None:
        for rid in [r for r, job in self._active.items() if job is not None and job.cancelled.is_set()]:
            self._remove(rid)  # its client is gone: nothing more is sent
            if turn is not None:
                turn.removals.append(rid)

    def _step(self) -> None:
        before = {p: self.clock.seconds[p] for p in ("graph", "launch", "wait")}
        started = time.perf_counter()
        _, responses = self._gen.next()
        done = time.perf_counter()
        timed = sum(self.clock.seconds[p] - before[p] for p in before)
        self.clock.add("batch", done - started - timed)
        self._kept()  # last step's finished rows, copied out by now (timed as post, with the rest below)
        self.clock.steps += 1
        by_sink: dict[int, tuple[Sink, list[Any]]] = {}
        if self.group is not None:
            self._checksum = sum(r.uid * 1000003 + int(r.token) for r in responses) & 0x7FFFFFFF
        kept = []
        for r in responses:
            rid = self._rid_of.get(r.uid)
            job = self._active.get(rid) if rid is not None else None
            if r.finish_reason is not None and rid is not None:  # end of sequence or max tokens: it left the batch
                del self._rid_of[r.uid], self._uid_of[rid]
                self._active.pop(rid, None)
                self._reserved.pop(rid, None)
                kept.append((r.prompt_cache, r.all_tokens, self._unslot(r.uid)))
            if job is None:  # another rank's row (following), or one cancelled meanwhile
                continue
            token = int(r.token)
            drafted = self._drafted(r.uid, keep=r.finish_reason is None)
            by_sink.setdefault(id(job.sink), (job.sink, []))[1].append(
                (job, token, r.finish_reason, job.read(token), drafted))
        posted = time.perf_counter()
        self.clock.add("post", posted - done)
        for sink, tokens in by_sink.values():  # one wake-up of each event loop (or one message) per step
            sink.deliver(tokens)
        delivered = time.perf_counter()
        self.clock.add("delivery", delivered - posted)
        if kept and self.prompt_cache is not None:
            import mlx.core as mx

            # Finished rows' caches go to the prompt cache next step, once the device has copied them
            # out: waiting for the copies here would wait for the step already launched as well.
            mx.async_eval([c.state for cache, _, _ in kept if cache for c in cache])
            self._keeping += kept
            self.clock.add("post", time.perf_counter() - delivered)

    def _kept(self) -> None:
        """The finished rows' caches copied out last step, into the prompt cache."""
        keeping, self._keeping = self._keeping, []
        for cache, tokens, salt in keeping:
            self._keep((cache, tokens), salt)

    def _fail_all(self, error: EngineError) -> None:
        for job in self._active.values():
            if job is not None:
                job.post(error)
        self._active.clear()
        self._reserved.clear()
        self._uid_of.clear()
        self._rid_of.clear()
        self._keeping.clear()
        self._slot_of.clear()
        self._salt_of.clear()
        for job in [*self._new, *self._held, *self._siblings.held()]:
            job.post(error)
        self._new.clear()
        self._held.clear()
        self._siblings.clear()
        self._admission = None
        if self._gen is not None:
            self._gen.close()
            self._gen = None
