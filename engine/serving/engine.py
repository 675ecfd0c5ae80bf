"""The engine as the handlers see it: one object holding the store and the pool, with async entry points.

A language model's work (chat, responses, decisions) runs on its batch scheduler's thread, which
batches concurrent generations; other kinds run one operation at a time on a worker thread. The
event loop keeps serving meanwhile; closing an event stream early (a client that went away) cancels
the work and frees its row or the model.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from swama.engine.decisions.checkpoints import CheckpointResult, predict
from swama.engine.decisions.decide import DecisionJob, DecisionResult, DecisionRun
from swama.engine.errors import BadInput, Cancelled, ContextTooLong, NotFound, WrongModel
from swama.engine.files import aliases
from swama.engine.files.store import InstalledModel, ModelStore
from swama.engine.kinds import LANGUAGE, SPEECH_TO_TEXT, VISION
from swama.engine.kinds.embeddings import Embeddings, check_dimensions, embed, spec_of, tokenize
from swama.engine.kinds.speech import Segment, synthesize
from swama.engine.kinds.transcription import Transcript, is_multilingual, transcribe
from swama.engine.model import LoadedModel
from swama.engine.runtime import compute_dtype
from swama.engine.serving.pool import ModelPool
from swama.engine.serving.prompt_cache import PromptCache, default_budget
from swama.engine.serving.scheduler import DECISION_ROWS, DEFAULT_ROWS, Scheduler
from swama.engine.serving.threads import THREADS
from swama.engine.text.generator import ChatRequest, Event, Finished, generate

T = TypeVar("T")
_DONE = object()


@dataclass
class EngineOptions:
    models_root: Path
    context_limit: int = 16384
    idle_seconds: float = 300
    max_concurrent: int = 3
    decision_prefix_reuse: bool = True
    default_max_tokens: int | None = None
    max_queue: int = 64  # requests waiting across the server before new ones are refused (429)
    max_model_queue: int = 32  # requests waiting for one model before new ones are refused (429)
    queue_timeout: float = 600  # seconds a request may wait for its model before giving up (503)
    prompt_cache_bytes: int = field(default_factory=default_budget)  # per model; 0: no prompt cache
    batching: bool = True  # continuous batching of chat and responses on language models
    batch_rows: int = DEFAULT_ROWS  # rows one model decodes together
    prefill_step: int | None = None  # prompt tokens read per step, interleaved with decoding (None: the device's)
    memory_limit: int | None = None  # bytes for all loaded models (None: the system's available memory)


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


async def _in_thread(step: Callable[[], T], cancel: threading.Event | None = None) -> T:
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


class Engine:
    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.store = ModelStore(options.models_root)
        # Observers the server hangs its metrics on: (model id, Finished) per generation, and
        # (model id, questions, shared prefix tokens) per decision request.
        self.on_generation: Callable[[str, Any], None] | None = None
        self.on_decisions: Callable[[str, int, int], None] | None = None
        self.pool = ModelPool(self.store, idle_seconds=options.idle_seconds,
                              max_concurrent=options.max_concurrent, max_queue=options.max_queue,
                              max_model_queue=options.max_model_queue, queue_timeout=options.queue_timeout,
                              memory_limit=options.memory_limit,
                              float_bytes=compute_dtype().size)

    def installed(self, name: str) -> InstalledModel:
        """The installed model for `name`; 404 when it is not installed (the server never downloads)."""
        if not isinstance(name, str) or not name.strip():
            raise BadInput("Model identifier is invalid.")
        model = self.store.find(name)
        if model is None:
            raise NotFound()
        return model

    def resolve_language_model(self, name: str) -> str:
        """The installed model id for `name`, refusing models that cannot generate text."""
        model = self.installed(name)
        if aliases.is_audio_model(name) or aliases.is_audio_model(model.id):
            raise WrongModel(f"Model '{name}' is an audio model; it cannot serve text generation.")
        self.require_language_model(model)
        return model.id

    @staticmethod
    def require_language_model(model: InstalledModel) -> None:
        """Chat, responses and decisions run on models that generate text: language models (mlx-lm)
        and vision-language models (mlx-vlm). Other kinds are refused by name."""
        if model.kind not in (LANGUAGE, VISION):
            article = "an" if model.kind[0] in "aeiou" else "a"
            raise WrongModel(f"Model '{model.id}' is {article} {model.kind} model; this route needs a language or "
                             "vision model.")

    async def chat(self, model_id: str, request: ChatRequest) -> AsyncIterator[Event]:
        """Events of one generation on a model `resolve` found. Stop iterating (or `aclose()`) to cancel."""
        limit = request.effective_context_limit
        if request.max_tokens is not None and request.max_tokens > limit:
            raise ContextTooLong(f"The requested maximum of {request.max_tokens} output tokens is larger than the "
                                 f"context window of {limit} tokens (prompt included).")
        if request.max_tokens is None:
            request.max_tokens = self.options.default_max_tokens
        try:
            if self._scheduled(model_id):
                async with self.pool.share(model_id, self._rows()) as model:
                    events = self._scheduler(model).generate(request)
                    try:
                        async for event in events:
                            self._observe(model_id, event)
                            yield event
                    finally:
                        await events.aclose()
                return
            async with self.pool.use(model_id) as model:
                async for event in iterate_in_thread(lambda cancel: generate(model, request, cancel)):
                    self._observe(model_id, event)
                    yield event
        except Cancelled:
            return

    def _observe(self, model_id: str, event: Event) -> None:
        if isinstance(event, Finished) and self.on_generation is not None:
            self.on_generation(model_id, event)

    def _rows(self) -> int:
        return self.options.batch_rows if self.options.batching else 1

    def _scheduled(self, model_id: str) -> bool:
        """Language models run all their work on their batch scheduler's thread; vision models,
        whose requests carry images, take the model exclusively instead."""
        return self.installed(model_id).kind == LANGUAGE

    def _scheduler(self, model: LoadedModel) -> Scheduler:
        scheduler = model.caches.get("scheduler")
        if scheduler is None:
            store = PromptCache(self.options.prompt_cache_bytes) if self.options.prompt_cache_bytes > 0 else None
            scheduler = Scheduler(model, prompt_cache=store, batching=self.options.batching,
                                  rows=self.options.batch_rows, prefill_step=self.options.prefill_step)
            model.caches["scheduler"] = scheduler
            model.caches["prompt_cache"] = store  # the same cache for requests served alone
        return scheduler

    async def decide(self, model_id: str, job: DecisionJob) -> AsyncIterator[DecisionResult]:
        """Score decision questions (the label scorer behind /v1/decisions and /v1/systemone).

        Preparation plus the shared prefill take one turn on the model, then every question takes
        its own turn, so a short request is not stuck behind a long one. Yields one result.
        `model_id` names a model `installed` found and `require_language_model` accepted.
        """
        run: DecisionRun | None = None
        if self._scheduled(model_id):
            async with self.pool.share(model_id, self._rows()) as model:
                scheduler = self._scheduler(model)
                run = DecisionRun(model, job, prefix_reuse=self.options.decision_prefix_reuse)
                await scheduler.run(run.start)
                if run.joins_others and not run.done:
                    await scheduler.score(run)  # in passes shared with concurrent decision requests
                while not run.done:
                    # The suffixes in batched passes, a few rows a turn: the decode steps of other
                    # requests on the model go on between the turns.
                    await scheduler.run(lambda: run.score_batch(max_rows=DECISION_ROWS))
        else:
            while run is None or not run.done:
                async with self.pool.use(model_id, admit=run is None) as model:
                    if run is None:
                        run = DecisionRun(model, job, prefix_reuse=self.options.decision_prefix_reuse)
                        step = run.start
                    else:
                        step = run.score_next
                    await _in_thread(step)
        result = run.result()
        if self.on_decisions is not None:
            self.on_decisions(model_id, len(result.answers), result.shared_prefix_tokens)
        yield result

    async def predict_checkpoint(self, model_id: str, state: Any, questions: dict[str, dict[str, Any]],
                                 images: list[Any]) -> CheckpointResult:
        """Answer System One questions on a decision checkpoint (kind "decision"), in one turn."""
        async with self.pool.use(model_id) as model:
            return await _in_thread(lambda: predict(model.checkpoint, state, questions, images))

    async def embed(self, model_id: str, texts: list[str], dimensions: int | None = None) -> Embeddings:
        """Unit-length embeddings of `texts` on an embedding model, in one turn on the model."""
        async with self.pool.use(model_id) as model:
            def work() -> Embeddings:
                check_dimensions(model.id, spec_of(model), dimensions)
                return embed(model, tokenize(model, texts), dimensions)

            return await _in_thread(work)

    async def speak(self, model_id: str, text: str, voice: str | None, speed: float) -> AsyncIterator[Segment]:
        """Audio segments of `text` on a text-to-speech model, as the model makes them; stop iterating
        (or `aclose()`) to cancel. `voice` is one `Voices.pick` chose."""
        try:
            async with self.pool.use(model_id) as model:
                async for segment in iterate_in_thread(lambda cancel: synthesize(model, text, voice, speed, cancel)):
                    yield segment
        except Cancelled:
            return

    def resolve_speech_model(self, name: str) -> str:
        """The installed model id for `name`, refusing models that do not turn speech into text."""
        model = self.installed(name)
        if model.kind != SPEECH_TO_TEXT:
            raise WrongModel(f"Model '{name}' is not a supported audio model")
        return model.id

    async def transcribe(self, model_id: str, audio: Any, *, language: str | None = None,
                         prompt: str | None = None, temperature: float = 0.0) -> Transcript:
        """Speech to text on a model `resolve_speech_model` found: 16 kHz mono samples in, one turn."""
        cancel = threading.Event()
        async with self.pool.use(model_id) as model:
            if language is not None and language != "en" and not is_multilingual(model):
                raise BadInput(f"Model '{model_id}' transcribes English only; language '{language}' is not "
                               "supported by it.")
            return await _in_thread(lambda: transcribe(model, audio, language=language, prompt=prompt,
                                                       temperature=temperature, cancel=cancel), cancel)

    async def close(self) -> None:
        await self.pool.close()
