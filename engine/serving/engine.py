"""The engine that runs in this process: the store, the pool and the schedulers behind the door
(engine/client.py `EngineClient`).

A language model's work (chat, responses, decisions) runs on its batch scheduler's thread, which
batches concurrent generations; other kinds run one operation at a time on a worker thread. The
event loop keeps serving meanwhile; closing an event stream early (a client that went away) cancels
the work and frees its row or the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from swama.engine.adapters.bank import bank_of, selected
from swama.engine.decisions.adjust.methods import CONTENT_FREE_INPUT
from swama.engine.decisions.adjust.plan import AdjustState, combine, plan_job
from swama.engine.decisions.adjust.store import CalibrationCache, CalibrationFile
from swama.engine.decisions.checkpoints import CheckpointResult, checkpoint_of, predict
from swama.engine.decisions.decide import DecisionJob, DecisionResult, DecisionRun
from swama.engine.decisions.packed_prefill import packable
from swama.engine.decisions.rerank import RerankJob, RerankResult, card_format, decision_job
from swama.engine.errors import BadInput, Cancelled, ContextTooLong
from swama.engine.files.kinds import LANGUAGE, RERANKER
from swama.engine.files.store import ModelStore
from swama.engine.kinds.cross_encoders import score_pairs
from swama.engine.kinds.embeddings import Embeddings, check_dimensions, embed, spec_of, tokenize
from swama.engine.kinds.speech import Segment, synthesize
from swama.engine.kinds.transcription import Transcript, check_language, transcribe
from swama.engine.model import LoadedModel, truncated
from swama.engine.priority import BATCH
from swama.engine.ranks import group as ranks
from swama.engine.ranks.group import STARTUP_TIMEOUT, group_of, shard_name
from swama.engine.runtime import compute_dtype, loaded_blas
from swama.engine.serving.installed import InstalledModels
from swama.engine.serving.pool import ModelPool
from swama.engine.serving.scheduler import DECISION_ROWS, Scheduler, Sink
from swama.engine.serving.threads import in_thread, iterate_in_thread
from swama.engine.serving.turn import PromptScore
from swama.engine.settings import EngineSettings, SettingsError
from swama.engine.speculative.policy import speculation_of
from swama.engine.text.generator import ChatRequest, Event, Finished, generate, prompt_ids
from swama.engine.text.grammar import CompileBudget
from swama.engine.text.kv_policy import use_kv_quant
from swama.engine.text.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, prompt_logprobs
from swama.engine.text.prompt_cache import PromptCache, prompt_cache_for, prompt_cache_of
from swama.engine.text.tokenize import Tokenized, TokenizeJob, text_of, tokens_of

log = logging.getLogger("swama.engine")


@dataclass(frozen=True)
class EngineStatus:
    """What /health and /metrics report of the engine."""

    models_loaded: list[str]
    running: int  # operations (and batch rows) running on a model now
    waiting: int  # requests admitted and waiting for their model
    blas: str  # the CPU BLAS in use: "mkl", "openblas" or "bundled"
    active_memory: int  # bytes MLX holds in live arrays
    cache_memory: int  # bytes MLX's buffer cache keeps for reuse
    kv_cache_bytes: int = 0  # key/value state held: batch rows and prompt caches, all models
    kv_cache_budget: int = 0  # the prompt caches' budget, all models: what key/value state may keep
    ranks: dict[str, Any] | None = None  # the rank group this process serves a model with (RankGroup.status)
    # Per model whose batch drafts (engine/speculative/), since its batch started: tokens drafted and
    # accepted, speculative steps and plain steps (keys drafted, accepted, steps, plain_steps).
    speculation: dict[str, dict[str, int]] = field(default_factory=dict)
    # Per model with a batch scheduler: seconds its thread spent in each part of its turns since it
    # started (engine/serving/timing.py PARTS), and its turns and decode steps.
    scheduler: dict[str, dict[str, float]] = field(default_factory=dict)
    process: dict[str, Any] | None = None  # the engine process (pid, restarts), when the engine runs in one
    # Per model with a prompt cache, per tier ("memory", "disk"): PromptCache.counters.
    prompt_cache: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    # Per model with a batch scheduler: its key/value state (Scheduler.kv_reading): bytes the rows hold
    # and reserve, the budget --memory-limit leaves them (0: none), requests waiting for room, the bits.
    kv: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def kv_cache_usage(self) -> float:
        """The share of the key/value budget in use, 0 to 1 (what inference gateways route on)."""
        return min(1.0, self.kv_cache_bytes / self.kv_cache_budget) if self.kv_cache_budget else 0.0


def check_generation(request: ChatRequest, settings: EngineSettings) -> None:
    """What a generation must hold before it is prepared: max_tokens within the context window (an
    unset one becomes the server's default)."""
    limit = request.effective_context_limit
    if request.max_tokens is not None and request.max_tokens > limit:
        raise ContextTooLong(f"The requested maximum of {request.max_tokens} output tokens is larger than the "
                             f"context window of {limit} tokens (prompt included).")
    if request.max_tokens is None:
        request.max_tokens = settings.default_max_tokens


class Engine(InstalledModels):
    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.store = ModelStore(settings.models_root)
        # Observers the server hangs its metrics on: (model id, Finished) per generation, and
        # (model id, questions, shared prefix tokens) per decision request.
        self.on_generation: Callable[[str, Finished], None] | None = None
        self.on_decisions: Callable[[str, int, int], None] | None = None
        self.pool = ModelPool(self.store, settings, float_bytes=compute_dtype().size)
        self._blas = loaded_blas() or "bundled"  # fixed once the process started (the preload restarts it)
        self._draft: LoadedModel | None = None  # --draft-model, once a scheduler needs it
        # Per model: positional priors being estimated and content-free answers (decision debiasing
        # and calibration), and the calibration files `swama calibrate` writes.
        self._adjust_states: dict[str, AdjustState] = {}
        self._calibrations = CalibrationCache()
        if settings.draft_model and self.store.find(settings.draft_model) is None:
            raise SettingsError(f"--draft-model: no installed model is named '{settings.draft_model}' "
                                "(`swama list` shows the installed ones)")

    def status(self) -> EngineStatus:
        import mlx.core as mx

        group = ranks.current()
        held = budget = 0
        speculation: dict[str, dict[str, int]] = {}
        clocks: dict[str, dict[str, float]] = {}
        tiers: dict[str, dict[str, dict[str, int]]] = {}
        kv: dict[str, dict[str, int]] = {}
        for model in self.pool.loaded_models():
            cache, scheduler = prompt_cache_of(model), model.beside.get(Scheduler)
            if cache is not None:
                held += cache.nbytes
                budget += cache.budget
                tiers[model.id] = cache.counters()
            if scheduler is not None:
                held += scheduler.kv_bytes()
                kv[model.id] = scheduler.kv_reading()
                clocks[model.id] = scheduler.clock.reading()
                # A drafting batch's generator (SpeculativeGenerator) keeps its counters; a plain one has none.
                counters = getattr(getattr(scheduler, "_gen", None), "counters", None)
                if counters is not None:
                    speculation[model.id] = {"drafted": counters.drafted, "accepted": counters.accepted,
                                             "steps": counters.steps, "plain_steps": counters.plain_steps}
        return EngineStatus(self.pool.loaded(), self.pool.running(), self.pool.waiting(), self._blas,
                            int(mx.get_active_memory()), int(mx.get_cache_memory()), held, budget,
                            group.status() if group is not None else None, speculation, clocks,
                            prompt_cache=tiers, kv=kv)

    async def refresh(self) -> None:
        """Nothing to do: status() reads this engine's state as it is."""

    async def start(self) -> None:
        """Load what must be there before the first request: on rank 0 of a group, the model the
        ranks split (the others load their shards at start and wait for rank 0's first turn)."""
        group = ranks.current()
        if group is None or group.model_id is None:
            return
        self.pool.pin(group.model_id, group.size)
        async with self.pool.share(group.model_id, self._rows()) as model:
            self._scheduler(model)
        # Serve once every rank has loaded its shard and joined a step (each wait is bounded).
        await in_thread(lambda: group.ready.wait(STARTUP_TIMEOUT))

    # -- text ------------------------------------------------------------------------------------

    async def chat(self, model_id: str, request: ChatRequest) -> AsyncIterator[Event]:
        """Events of one generation on a model `model_for` found. Stop iterating (or `aclose()`) to cancel."""
        check_generation(request, self.settings)
        request = replace(request, batch=request.batch or BATCH.get())
        adapter = self.model(model_id)
        base_id = self.base_of(adapter).id
        try:
            if self._scheduled(base_id):
                async with self.pool.share(base_id, self._rows()) as model, \
                        self._adapter(model, adapter) as slot:
                    if slot:
                        request = replace(request, adapter=adapter.id, adapter_slot=slot)
                    events = self._scheduler(model).generate(request)
                    try:
                        async for event in events:
                            self._observe(model_id, event)
                            yield event
                    finally:
                        await events.aclose()
                return
            async with self.pool.use(base_id) as model, self._adapter(model, adapter) as slot:
                if slot:
                    request = replace(request, adapter=adapter.id, adapter_slot=slot)
                async for event in iterate_in_thread(lambda cancel: generate(model, request, cancel)):
                    self._observe(model_id, event)
                    yield event
        except Cancelled:
            return

    @contextlib.asynccontextmanager
    async def _adapter(self, model: LoadedModel, installed: Any) -> AsyncIterator[int]:
        """The bank slot of the LoRA adapter `installed` is (0 when it is a model) on its base `model`,
        held while the request runs; refused where adapters are not served."""
        if installed.base is None:
            yield 0
            return
        if group_of(model) is not None:
            raise BadInput(f"Adapter '{installed.id}' cannot run on '{model.id}': the model is split across ranks "
                           "(--ranks), which serve it without adapters.", param="model")
        scheduler = self._scheduler(model)
        scheduler.adapters = True
        if scheduler.compiled:
            raise BadInput(f"Adapter '{installed.id}' cannot run on '{model.id}' as loaded: its batch runs the compiled "
                           "decode step, which has no adapters. It was installed after the model loaded; the model "
                           "takes mlx-lm's forward once it is loaded again (after --idle-seconds, or a restart), or "
                           "start the server with --compiled-step off.", param="model")
        bank = bank_of(model, self.settings.max_adapters)
        slot = await in_thread(lambda: bank.acquire(installed.id, installed.path))
        try:
            yield slot
        finally:
            bank.release(installed.id)

    async def stream_tokens(self, model_id: str, ids: list[int], request: ChatRequest, opens_thinking: bool,
                            sink: Sink, cid: int, ended: asyncio.Event) -> bool:
        """A prompt a front end in another process rendered and tokenized, generated in the model's batch;
        its tokens go to `sink` until `ended` is set (by the sink, at the job's end) or this is cancelled.
        False when the model's batch cannot take it (its caches do not merge): the front end then asks
        for the generation's events instead."""
        adapter = self.model(model_id)
        async with self.pool.share(self.base_of(adapter).id, self._rows()) as model, \
                self._adapter(model, adapter) as slot:
            scheduler = self._scheduler(model)
            if not scheduler.batching:
                return False
            if slot:
                request = replace(request, adapter=adapter.id, adapter_slot=slot)
            def submit() -> Any:
                return scheduler.submit_tokens(ids, request, opens_thinking, sink, cid)

            # A grammar may take a while to compile: off the event loop. Anything else is quick.
            job = submit() if request.constraint is None else await in_thread(submit)
            try:
                await ended.wait()
            finally:
                scheduler.cancel(job)
        return True

    async def tokenize_prompt(self, model_id: str, prompt: str | list[int]) -> list[int]:
        """A raw prompt's tokens as `ChatRequest.prompt` reads them (BadInput for ids outside the
        vocabulary or an empty prompt)."""
        async with self._held(model_id) as model:
            return await in_thread(lambda: prompt_ids(model, prompt))

    async def score_prompt(self, model_id: str, ids: list[int], top: int = 0,
                           temperature: float = 1.0) -> list[TokenLogprob]:
        """Each prompt token with its log probability given the ones before it (the first's: None), with
        `top` alternatives: a forward pass over the prompt, in one turn on the model."""
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise BadInput(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}.")
        limit = self.settings.context_limit
        if len(ids) > limit:
            raise ContextTooLong(f"The prompt ({len(ids)} tokens) is longer than the context window of "
                                 f"{limit} tokens.", code="context_limit_exceeded")
        adapter = self.model(model_id)
        async with self._held(model_id) as model, self._adapter(model, adapter) as slot:
            def work() -> list[TokenLogprob]:
                with selected(model, slot):
                    return prompt_logprobs(model, ids, top, temperature)

            if self._scheduled(model_id):
                scheduler = self._scheduler(model)
                mirror = PromptScore(ids, top, temperature) if scheduler.group is not None else None
                return await scheduler.run(work, mirror)
            return await in_thread(work)

    @contextlib.asynccontextmanager
    async def _held(self, model_id: str) -> AsyncIterator[LoadedModel]:
        """The model held the way its kind is served: shared by its scheduler, or exclusively (a LoRA
        adapter's base model for an adapter)."""
        model_id = self.base_of(self.model(model_id)).id
        if self._scheduled(model_id):
            async with self.pool.share(model_id, self._rows()) as model:
                yield model
        else:
            async with self.pool.use(model_id) as model:
                yield model

    def _observe(self, model_id: str, event: Event) -> None:
        if isinstance(event, Finished) and self.on_generation is not None:
            self.on_generation(model_id, event)

    def _rows(self) -> int:
        return self.settings.batch_rows if self.settings.batching else 1

    def _scheduled(self, model_id: str) -> bool:
        """Language models run all their work on their batch scheduler's thread; vision models,
        whose requests carry images, take the model exclusively instead."""
        return self.model(model_id).kind == LANGUAGE

    def _scheduler(self, model: LoadedModel) -> Scheduler:
        scheduler = model.beside.get(Scheduler)
        if scheduler is None:
            use_kv_quant(model, self.settings.kv_quant())  # before the caches below are made
            cache = prompt_cache_for(model, self.settings.prompt_cache_budget(), self.settings.prompt_disk_dir(),
                                     self.settings.prompt_cache_disk_bytes, shard_name(group_of(model)))
            model.beside.set(PromptCache, cache)  # the same cache for requests served alone
            model.beside.set(CompileBudget, CompileBudget(self.settings.grammar_compile_seconds))
            scheduler = Scheduler(model, prompt_cache=cache, batching=self.settings.batching,
                                  rows=self.settings.batch_rows, prefill_step=self.settings.prefill_step,
                                  prefill_wait=self.settings.prefill_wait,
                                  profile_dir=self.settings.profile_dir,
                                  speculation=speculation_of(self.settings),
                                  compiled_step=self.settings.compiled_step,
                                  draft=self._draft_for(model), kv_budget=self._kv_budget())
            scheduler.adapters = any(m.base == model.id for m in self.store.list())
            model.beside.set(Scheduler, scheduler)  # closed with the model
        return scheduler

    def _kv_budget(self) -> int | None:
        """Key/value bytes a model's batch rows may reserve: what --memory-limit leaves beside the loaded
        models' weights and this model's prompt cache; None without a limit (rows are not counted)."""
        if self.settings.memory_limit is None:
            return None
        return max(0, self.settings.memory_limit - self.pool.weights_bytes() - self.settings.prompt_cache_budget())

    def _draft_for(self, model: LoadedModel) -> LoadedModel | None:
        """The draft model for `model`'s batch: --draft-model, when its tokenizer is the model's own
        (same vocabulary, same end tokens); loaded once and shared by the models it drafts for."""
        name = self.settings.draft_model
        if name is None or self.settings.speculative not in ("draft", "auto") or group_of(model) is not None:
            return None
        if self._draft is None:
            installed = self.model(name)
            from swama.engine.text.language import load_language_model

            self._draft = load_language_model(installed.id, installed.path)
        draft = self._draft
        if (draft.vocab_size, draft.tokenizer.vocab_size, draft.eos_ids) != (
                model.vocab_size, model.tokenizer.vocab_size, model.eos_ids):
            log.warning("draft model %s does not share %s's tokenizer: %s decodes without it", draft.id, model.id,
                        model.id)
            return None
        return draft

    # -- decisions -------------------------------------------------------------------------------

    async def decide(self, model_id: str, job: DecisionJob) -> AsyncIterator[DecisionResult]:
        """Answer decision questions (behind /v1/decisions, /v1/systemone and Clef): the label
        scorer's answers, debiased and calibrated where the job's adjustments ask (see
        engine/decisions/adjust). Without adjustments the scorer's result is returned as it is."""
        job = replace(job, batch=job.batch or BATCH.get())
        if not any(a.active for a in job.adjustments):
            async for result in self._score(model_id, job):
                yield result
            return
        installed = self.model(model_id)
        state = self._adjust_states.setdefault(model_id, AdjustState())
        try:
            calibration = self._calibrations.get(installed.path)
        except ValueError as exc:  # a damaged file: what needs none still works; `fitted` says to calibrate again
            log.warning("%s: %s", model_id, exc)
            calibration = CalibrationFile()
        plan = plan_job(model_id, job.questions, job.adjustments, state, calibration)
        result = await self._scored(model_id, replace(job, questions=plan.views, adjustments=()))
        input_tokens = result.input_tokens
        missing = [v for v in plan.content_free_views if state.remembered(v) is None]
        if missing:
            # Content-free answers: the same questions about an input that says nothing, no images.
            blank = DecisionJob(CONTENT_FREE_INPUT, missing, context_limit=job.context_limit, systemone=job.systemone)
            content_free = await self._scored(model_id, blank)
            for view, answer in zip(missing, content_free.answers, strict=True):
                state.remember(view, answer.probabilities)
            input_tokens += content_free.input_tokens
        answers, applied = combine(plan, result.answers, state)
        yield DecisionResult(answers, input_tokens, result.shared_prefix_tokens, applied)

    async def rerank(self, model_id: str, job: RerankJob) -> AsyncIterator[RerankResult]:
        """Each document's relevance to the query (behind /v1/rerank, /v2/rerank and /v1/score): a
        cross-encoder's own score (engine/kinds/cross_encoders.py), or on a language or vision model one
        decision job of yes/no questions over the query as the shared prefix (engine/decisions/rerank.py)."""
        installed = self.model(model_id)
        if installed.kind == RERANKER:  # a cross-encoder reads each pair itself
            cancel = threading.Event()
            async with self.pool.use(model_id) as model:
                pairs = await in_thread(lambda: score_pairs(model, job.query, job.documents, job.max_tokens_per_doc,
                                                            cancel), cancel)
            yield RerankResult(pairs.scores, pairs.input_tokens)
            return
        documents = job.documents
        if job.max_tokens_per_doc is not None:
            async with self._held(model_id) as model:
                documents = await in_thread(lambda: truncated(model.tokenizer, job.documents, job.max_tokens_per_doc))
        base = self.base_of(installed)
        card = card_format(base.id, base.source)
        async for result in self.decide(model_id, decision_job(replace(job, documents=documents), card)):
            yield RerankResult([answer.p_yes for answer in result.answers], result.input_tokens)

    async def _scored(self, model_id: str, job: DecisionJob) -> DecisionResult:
        async for result in self._score(model_id, job):
            return result
        raise Cancelled()

    async def _score(self, model_id: str, job: DecisionJob) -> AsyncIterator[DecisionResult]:
        """Score decision questions with the label scorer.

        Preparation plus the shared prefill take one turn on the model, then every question takes
        its own turn, so a short request is not stuck behind a long one. Yields one result.
        `model_id` names a model that `require(model, Task.DECIDE)` accepted.
        """
        run: DecisionRun | None = None
        reuse = self.settings.decision_prefix_reuse
        adapter = self.model(model_id)
        base_id = self.base_of(adapter).id
        if self._scheduled(base_id):
            async with self.pool.share(base_id, self._rows()) as model, self._adapter(model, adapter) as slot:
                job = replace(job, adapter_slot=slot)
                scheduler = self._scheduler(model)
                run = DecisionRun(model, job, prefix_reuse=reuse)
                await in_thread(run.prepare)  # templates, tokenizing and label checks: off the model's thread
                try:
                    if scheduler.group is None and packable(run):
                        await scheduler.decide(run)  # prefix packed with others', questions in shared passes
                    else:
                        await scheduler.prefill(run)
                        if run.joins_others and not run.done:
                            await scheduler.score(run)  # in passes shared with concurrent decision requests
                    while not run.done:
                        # The suffixes in batched passes, a few rows a turn: the decode steps of other
                        # requests on the model go on between the turns.
                        await scheduler.score_batch(run, DECISION_ROWS)
                finally:
                    scheduler.forget(run)
        else:
            while run is None or not run.done:
                async with self.pool.use(base_id, admit=run is None) as model:
                    if run is None:
                        run = DecisionRun(model, job, prefix_reuse=reuse)
                        step = run.start
                    else:
                        step = run.score_next
                    await in_thread(step)
        result = run.result()
        if self.on_decisions is not None:
            self.on_decisions(model_id, len(result.answers), result.shared_prefix_tokens)
        yield result

    async def predict_checkpoint(self, model_id: str, state: Any, questions: dict[str, dict[str, Any]],
                                 images: list[Any]) -> CheckpointResult:
        """Answer System One questions on a decision checkpoint (kind "decision"), in one turn."""
        async with self.pool.use(model_id) as model:
            return await in_thread(lambda: predict(checkpoint_of(model), state, questions, images))

    # -- other kinds -----------------------------------------------------------------------------

    async def embed(self, model_id: str, texts: list[str], dimensions: int | None = None) -> Embeddings:
        """Unit-length embeddings of `texts` on an embedding model, in one turn on the model."""
        async with self.pool.use(model_id) as model:
            def work() -> Embeddings:
                check_dimensions(model.id, spec_of(model), dimensions)
                return embed(model, tokenize(model, texts), dimensions)

            return await in_thread(work)

    async def speak(self, model_id: str, text: str, voice: str | None, speed: float) -> AsyncIterator[Segment]:
        """Audio segments of `text` on a text-to-speech model, as the model makes them; stop iterating
        (or `aclose()`) to cancel. `voice` is one `Voices.pick` chose."""
        try:
            async with self.pool.use(model_id) as model:
                async for segment in iterate_in_thread(lambda cancel: synthesize(model, text, voice, speed, cancel)):
                    yield segment
        except Cancelled:
            return

    async def transcribe(self, model_id: str, audio: Any, *, language: str | None = None,
                         prompt: str | None = None, temperature: float = 0.0) -> Transcript:
        """Speech to text on a speech-to-text model: 16 kHz mono float32 samples in, one turn."""
        cancel = threading.Event()
        async with self.pool.use(model_id) as model:
            check_language(model, language)
            return await in_thread(lambda: transcribe(model, audio, language=language, prompt=prompt,
                                                      temperature=temperature, cancel=cancel), cancel)

    # -- tokenizer -------------------------------------------------------------------------------

    async def tokenize(self, model_id: str, job: TokenizeJob) -> Tokenized:
        """The tokens of a text prompt or a rendered chat on a language or vision model (POST /tokenize):
        the template and the tokenizer run on a worker thread, beside the model's own work."""
        job.check()  # before the model loads
        async with self._held(model_id) as model:
            return await in_thread(lambda: tokens_of(model, job, self.settings.context_limit))

    async def detokenize(self, model_id: str, ids: list[int]) -> str:
        """The text of token ids on a language or vision model (POST /detokenize); BadInput for an id
        outside its vocabulary."""
        async with self._held(model_id) as model:
            return await in_thread(lambda: text_of(model, ids))

    async def close(self) -> None:
        await self.pool.close()
