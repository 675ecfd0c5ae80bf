"""The label scorer on a loaded model: one engine behind /v1/decisions and /v1/systemone.

Every question is prepared and checked before anything is scored (one refusal refuses the whole
request). Scoring then reads the next-token logits at the answer position. By default the questions
share one prefill of their common prefix (chat-template header plus the input): the prefix's KV
state is computed once and each question's suffix is scored from it. `prefix_reuse=False` gives
every question a fresh cache instead, bit for bit like scoring it alone.

With images (vision models only) the checks run on the text-only render of each question, as the
decision routes document, and the scored prompt is the multimodal one: the images go first in the
user message, each expanded into its image tokens by the model's processor. When the questions
share a prefix that holds every image, the vision tower runs once per request and the prefix
(header, images, input) is prefilled once; otherwise every question is encoded on its own.

`DecisionRun` is the API, in steps:

    run = DecisionRun(model, job)       # prefix_reuse=True by default
    run.start()                         # prepare and check every question, prefill the shared prefix
                                        # (or run.prepare() on any thread, then run.prefill())
    while not run.done:
        run.score_batch(max_rows=8)     # or run.score_next(): one question per call
    run.result()

`score_batch(max_rows=None)` scores the remaining questions (at most `max_rows` of them) and
appends their answers to `run.answers` in question order, as that many `score_next()` calls would
(the same answers up to float rounding in the batched matrix products). Where the shared prefix sits in plain KV caches (`run.batches`), their suffixes run in one
batched forward pass: the suffix rows are right-padded to the longest, every row of the batch cache
holds a copy of the prefix keys and values, and each row's logits are read at its own last real
token (causal attention keeps the padding after it out of sight). Rows go in chunks that keep the
batch's logits and its copy of the prefix cache within `batch_logits_bytes` and
`batch_cache_bytes`. Everywhere else (recurrent or sliding-window caches, images, vision models,
`prefix_reuse=False`) `score_batch` calls `score_next` per question, unchanged.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from swama.engine.adapters.bank import selected
from swama.engine.decisions import shared_prefix
from swama.engine.decisions.adjust.methods import Adjustment, Applied
from swama.engine.decisions.heads import Head, fill_cache, head_split, logits_at
from swama.engine.decisions.next_token import NextToken, PendingRows, launch_rows, reduce_rows
from swama.engine.decisions.scorer import (
    CHAT_TEMPLATE_REQUIRED,
    DecisionError,
    HFLabelTokenizer,
    QuestionView,
    ScoredAnswer,
    answer_from_logprobs,
    build_content,
    check_context,
    check_reasoning_closed,
    find_pair_labels,
    label_token_ids,
    labels_for,
    logprobs_from_reduction,
    reasoning_opener_ids,
)
from swama.engine.decisions.scorer.batch_encode import encode_prompts, round_trips
from swama.engine.decisions.scorer.checks import REASONING_OPENER_PREDICTED, ROUND_TRIP_FAILED
from swama.engine.kinds.tasks import IMAGES_NEED_VISION
from swama.engine.kinds.vision import (
    LOW_DETAIL_SIDE,
    MULTIMODAL_CONTEXT_LIMIT,
    Prefill,
    fit_within,
    network,
    vision_of,
)
from swama.engine.model import LoadedModel


@dataclass(frozen=True)
class DecisionJob:
    text: str  # the rendered input (decisions) or state (systemone)
    questions: Sequence[QuestionView]
    context_limit: int
    systemone: bool = False  # context refusals carry the System One capacity phrase
    images: Sequence[Any] = ()  # PIL images, placed before the text
    low_detail: bool = False  # every image asked `detail: "low"`: fit them within 512 px
    # Per question, what it asks beyond the plain reading (debiasing, calibration): the engine's
    # `decide` expands and combines around the scorer, which never sees them. Empty: none.
    adjustments: Sequence[Adjustment] = ()
    batch: bool = False  # a batch job's line: packed and scored after live requests (engine/priority.py)
    adapter_slot: int = 0  # a LoRA adapter's slot in the model's bank (engine/adapters/); 0: none
    # Finished prompts, one per question, scored as they are instead of the decision prompt in the
    # model's chat template (a model card's own format: engine/decisions/rerank.py); text only.
    prompts: Sequence[str] = ()


@dataclass(frozen=True)
class PreparedQuestion:
    view: QuestionView
    ids: list[int]
    label_ids: list[int]
    processed: Any = None  # vision.Processed: the multimodal prompt, when the job has images


@dataclass(frozen=True)
class DecisionResult:
    answers: list[ScoredAnswer]
    input_tokens: int
    shared_prefix_tokens: int  # 0 when every question had its own cache
    applied: Sequence[Applied | None] = ()  # per answer, what debiasing and calibration did (if asked)


def _render(model: LoadedModel, content: str, image_count: int = 0) -> str:
    message: Any = content
    if image_count:
        message = [{"type": "image"}] * image_count + [{"type": "text", "text": content}]
    return model.tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                               enable_thinking=False, tokenize=False)


class DecisionState:
    """What the scorer works out once per loaded model (kept beside it): the label
    tokenizer, the pair labels for more than 26 options, the reasoning-opener ids, the label-token
    memo, the verified head split and the bound on a batched pass's prefix copies."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.label_memo: dict[Any, Any] = {}
        self.preparing = threading.Lock()  # the tokenizer's memo and cached labels are built under it
        # Batched passes attend the shared prefix in place (shared_prefix.py), until a pass shows the
        # model's attention does not go through its module's function: on the CPU as a product per
        # prefix, on a GPU as one fused attention call per layer with each request's rows laid end
        # to end (`fused`: whole requests per pass, see `pick_rows`). Both beat copying the prefix
        # into every row (docs/benchmarks.md).
        import mlx.core as mx

        self.in_place = True
        self.fused = mx.default_device() != mx.cpu
        if model.model is not None:
            shared_prefix.install(model.model)

    @functools.cached_property
    def label_tokenizer(self) -> HFLabelTokenizer:
        return HFLabelTokenizer(self.model.tokenizer._tokenizer)

    @functools.cached_property
    def pair_labels(self) -> Sequence[str] | None:
        return find_pair_labels(self.label_tokenizer, lambda c: _render(self.model, c))

    @functools.cached_property
    def opener_ids(self) -> list[int]:
        return reasoning_opener_ids(self.label_tokenizer)

    @functools.cached_property
    def head_split(self) -> Head | None:
        """The model's verified body and head (text models), so only scored positions are projected."""
        return head_split(self.model.model) if vision_of(self.model) is None else None

    @functools.cached_property
    def batch_cache_bytes(self) -> int:
        return default_batch_cache_bytes()

    @functools.cached_property
    def plain_cache(self) -> bool:
        """Whether the model's fresh cache is plain key/value layers only (text models)."""
        from mlx_lm.models.cache import make_prompt_cache

        return vision_of(self.model) is None and plain_kv(make_prompt_cache(self.model.model))


def decision_state(model: LoadedModel) -> DecisionState:
    return model.beside.setdefault(DecisionState, lambda: DecisionState(model))


def context_limit(job: DecisionJob) -> int:
    return min(job.context_limit, MULTIMODAL_CONTEXT_LIMIT) if job.images else job.context_limit


def prepare(model: LoadedModel, job: DecisionJob) -> list[PreparedQuestion]:
    if not job.prompts and not model.has_chat_template:
        raise DecisionError(400, CHAT_TEMPLATE_REQUIRED)
    state = decision_state(model)
    tok = state.label_tokenizer
    limit = context_limit(job)
    rendered = []
    for i, view in enumerate(job.questions):
        labels = labels_for(view, lambda: state.pair_labels)
        if job.prompts:
            rendered.append((view, labels, None, job.prompts[i]))
            continue
        content = build_content(job.text, view, labels)
        rendered.append((view, labels, content, _render(model, content)))
    prompts = [prompt for *_, prompt in rendered]
    # All prompts at once: the shared input is encoded once, the tokenizer runs in parallel.
    encoded = encode_prompts(tok, prompts)
    all_ids = encoded.ids
    round_trip = round_trips(tok, prompts, encoded)
    for (_, _, content, prompt), ids, ok in zip(rendered, all_ids, round_trip, strict=True):
        check_context(len(ids), limit, systemone=job.systemone)
        if not ok:
            raise DecisionError(400, ROUND_TRIP_FAILED)
        if content is not None:  # a card's own prompt is taken as its card writes it
            check_reasoning_closed(prompt, content)
    vision = vision_of(model)
    if job.images and vision is None:
        raise DecisionError(400, IMAGES_NEED_VISION)
    images = [fit_within(i, LOW_DETAIL_SIDE) for i in job.images] if job.low_detail else list(job.images)
    prepared = []
    memo = state.label_memo
    for (view, labels, content, prompt), ids in zip(rendered, all_ids, strict=True):
        label_ids = label_token_ids(tok, prompt, ids, labels, memo)
        if not images:
            prepared.append(PreparedQuestion(view, ids, label_ids))
            continue
        processed = vision.process(_render(model, content, len(images)), images)
        check_context(len(processed.ids), limit, systemone=job.systemone)
        prepared.append(PreparedQuestion(view, processed.ids, label_ids, processed))
    return prepared


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix every sequence shares, leaving each at least one token to score."""
    if not sequences:
        return 0
    n = max(min(len(s) for s in sequences) - 1, 0)
    first = np.asarray(sequences[0][:n])
    for s in sequences[1:]:
        differs = np.flatnonzero(np.asarray(s[:n]) != first)
        if differs.size:
            n = int(differs[0])
            first = first[:n]
    return n


def _last_logits(net: Any, ids: Sequence[int], cache: Any, prefill: Prefill | None = None,
                 split: Head | None = None) -> Any:
    """Logits after `ids` on `net` (a model or a vision model's language view), [1, vocab] float32,
    evaluated; with `prefill`, its input embeddings (image features in place) feed the model
    instead of the ids alone; with `split`, only the last position goes through the vocabulary
    projection."""
    import mlx.core as mx

    if prefill is None:
        logits = logits_at(net, split, mx.array(ids)[None], cache, mx.array([0]), mx.array([len(ids) - 1]))
    else:
        net.expect(prefill)
        out = net(mx.array(ids)[None], cache=cache, input_embeddings=prefill.embeddings)
        logits = out[:, -1].astype(mx.float32)
    mx.eval(logits)  # before the cache is trimmed or dropped
    return logits


def snapshot_cache(cache: list[Any]) -> list[Any]:
    """Each layer cache's state (and meta state, where it has one), to be restored many times.

    The state is evaluated now: a recurrent layer's final state is not needed for the prefix's own
    logits, and left lazy it could only be computed on the thread that built it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    snapshot = [(c.state, getattr(c, "meta_state", None)) for c in cache]
    mx.eval([leaf for _, leaf in tree_flatten([state for state, _ in snapshot]) if isinstance(leaf, mx.array)])
    return snapshot


def _fresh(value: Any) -> Any:
    import mlx.core as mx

    if isinstance(value, mx.array):
        return mx.array(value)  # its own object: cache updates write in place into the arrays they hold
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(v) for v in value)
    return value


def restore_cache(snapshot: list[Any], cache: list[Any]) -> list[Any]:
    """`cache` (fresh, of the same model) set to the snapshot's state, sharing no array with it."""
    for layer, (state, meta) in zip(cache, snapshot, strict=True):
        layer.state = _fresh(state)
        if meta is not None:
            layer.meta_state = meta
    return cache


# Bounds on one batched pass (see DecisionRun.score_batch): its rows x width x vocab float32 logits,
# and its rows' copies of the prefix keys and values.
BATCH_LOGITS_BYTES = 256 * 2**20
BATCH_CACHE_BYTES = 1024 * 2**20
GPU_BATCH_CACHE_BYTES = 16 * 2**30  # at most, and at most an eighth of the GPU's free memory
FUSED_WIDTH_STEP = 16  # a fused pass's suffix width is a multiple of this


def default_batch_cache_bytes() -> int:
    """The bound on a batched pass's copies of the prefix cache: 1 GiB on the CPU; on a GPU an eighth
    of its free memory, up to 16 GiB (20 rows of a 1,000-token prefix of a Qwen3-0.6B-sized model
    take 2.5 GB: under the CPU bound they would run in three passes)."""
    from swama.engine.runtime import available_bytes, on_gpu

    if not on_gpu():
        return BATCH_CACHE_BYTES
    free = available_bytes() or 0
    return max(BATCH_CACHE_BYTES, min(GPU_BATCH_CACHE_BYTES, free // 8))


def plain_kv(cache: list[Any]) -> bool:
    """Whether every layer cache is exactly mlx-lm's KVCache (no subclass, no other kind)."""
    from mlx_lm.models.cache import KVCache

    return all(type(c) is KVCache for c in cache)


def kv_bytes_per_token(cache: list[Any]) -> int:
    """Bytes one token takes over all layers of a filled plain KV cache (keys and values)."""
    total = 0
    for c in cache:
        if c.keys is not None:
            total += (c.keys.shape[1] * c.keys.shape[3] + c.values.shape[1] * c.values.shape[3]) * c.keys.itemsize
    return total


def tiled_cache(shared: list[Any], rows: int, room: int) -> list[Any]:
    """A fresh batch cache of `rows` rows, each holding the prefix of `shared` (plain KV caches), with
    room for `room` more tokens. `shared` is only read."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    tiled = []
    for layer in shared:
        keys, values = layer.keys_and_values()  # the prefix: [1, heads, prefix, dim]
        # Allocated at its final length, so the batch's update writes in place instead of regrowing.
        layer_cache = KVCache()
        layer_cache.state = (
            mx.concatenate([mx.repeat(keys, rows, axis=0),
                            mx.zeros((rows, keys.shape[1], room, keys.shape[3]), keys.dtype)], axis=2),
            mx.concatenate([mx.repeat(values, rows, axis=0),
                            mx.zeros((rows, values.shape[1], room, values.shape[3]), values.dtype)], axis=2),
            layer.offset)
        tiled.append(layer_cache)
    return tiled


def batch_chunks(lengths: Sequence[int], vocab: int, prefix: int, kv_token_bytes: int,
                 logits_bytes: int, cache_bytes: int) -> list[range]:
    """Consecutive rows (by index into `lengths`, the suffix lengths) for batched passes, each as
    many rows as keep its outputs (rows x longest x `vocab` float32 values per position: the
    vocabulary, or the hidden size where only scored positions are projected) within `logits_bytes` and its copy
    of the cache (rows x (prefix + longest) x `kv_token_bytes`) within `cache_bytes`; at least one
    row each."""
    chunks: list[range] = []
    start, width = 0, 0
    for i, n in enumerate(lengths):
        w = max(width, n)
        rows = i - start + 1
        if rows > 1 and (rows * w * vocab * 4 > logits_bytes or rows * (prefix + w) * kv_token_bytes > cache_bytes):
            chunks.append(range(start, i))
            start, w = i, n
        width = w
    if start < len(lengths):
        chunks.append(range(start, len(lengths)))
    return chunks


def trims_exactly(cache: list[Any]) -> bool:
    """Whether trimming `cache` back to its current length always restores it. A sliding-window
    (rotating) layer can be trimmed only until a suffix wraps past its window, so it never counts."""
    from mlx_lm.models.cache import can_trim_prompt_cache

    return can_trim_prompt_cache(cache) and all(getattr(c, "max_size", None) is None for c in cache)


class DecisionRun:
    """One request's scoring, in steps: `start()` prepares every question and prefills the shared
    prefix; `score_next()` scores one question, `score_batch()` several in batched passes. Between
    steps the model can serve other requests (the KV state of the prefix belongs to this run), which
    is how concurrent requests share a model fairly."""

    batch_logits_bytes: int = BATCH_LOGITS_BYTES
    batch_cache_bytes: int = BATCH_CACHE_BYTES  # replaced per run by the device's bound (see __init__)

    def __init__(self, model: LoadedModel, job: DecisionJob, *, prefix_reuse: bool = True) -> None:
        self.model, self.job, self.prefix_reuse = model, job, prefix_reuse
        self.state = decision_state(model)
        self.batch_cache_bytes = self.state.batch_cache_bytes
        self.net = network(model)
        self.prepared: list[PreparedQuestion] = []
        self.answers: list[ScoredAnswer] = []
        self.prefix = 0
        self.launched = 0  # questions handed to passes across runs (`launch_across`), answered or not
        self.vision_encodings = 0
        self.shared: Any = None  # a trimmable cache holding the shared prefix
        self.key: int | None = None  # its name in the steps a rank group shares (serving/scheduler.py)
        self._snapshot: list[Any] | None = None  # or the prefix state of a cache that cannot be trimmed

    @property
    def done(self) -> bool:
        return len(self.answers) == len(self.prepared)

    def _cache(self) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.net)

    def _fill(self, ids: Sequence[int], cache: list[Any], prefill: Prefill | None) -> None:
        """The shared prefix into `cache`; its own logits are never needed (every question has at
        least one token after it)."""
        import mlx.core as mx

        if prefill is None:
            fill_cache(self.net, mx.array(ids)[None], cache)
        else:
            self.net.expect(prefill)
            fill_cache(self.net, mx.array(ids)[None], cache, input_embeddings=prefill.embeddings)

    @property
    def split(self) -> Head | None:
        return self.state.head_split

    @property
    def position_bytes(self) -> int:
        """Bytes a batched pass holds per input position: its float32 logits without a head split,
        else its hidden state (the logits then exist for one position per row)."""
        if self.split is None:
            return self.model.vocab_size * 4
        return int(self.model.config.get("hidden_size") or self.model.vocab_size) * 4

    def _prefill(self, q: PreparedQuestion) -> Prefill | None:
        if q.processed is None:
            return None
        self.vision_encodings += 1
        vision = vision_of(self.model)
        assert vision is not None  # only a vision model's questions are processed
        return vision.embed(q.processed)

    def start(self) -> None:
        self.prepare()
        self.prefill()

    def prepare(self) -> None:
        """Render, tokenize and check every question: host work only, which may run on any thread
        (one request's at a time per model), so the model's own thread only drives the device."""
        with self.state.preparing:
            self.prepared = prepare(self.model, self.job)
            self.state.opener_ids  # noqa: B018 - worked out now, not in a batched pass
        if self.prefix_reuse and len(self.prepared) > 1:
            self.prefix = common_prefix([q.ids for q in self.prepared])
            first = self.prepared[0].processed
            if first is not None and self.prefix <= first.last_image_index:
                self.prefix = 0  # the questions part before the last image: nothing to share

    def prefill(self) -> None:
        """The shared prefix into this (prepared) run's cache, on the model's thread."""
        with selected(self.model, self.job.adapter_slot):
            self._prefill_shared()

    def _prefill_shared(self) -> None:
        if self.prefix > 0:
            first = self.prepared[0]
            prefill = self._prefill(first)
            self.shared = self._cache()
            self._fill(first.ids[: self.prefix], self.shared, prefill.head(self.prefix) if prefill is not None else None)
            if not trims_exactly(self.shared):
                # Recurrent or sliding-window layers cannot be trimmed back to the prefix: keep a
                # snapshot of the prefix state instead and give every question its own copy of it.
                self._snapshot, self.shared = snapshot_cache(self.shared), None

    def score_next(self) -> ScoredAnswer:
        with selected(self.model, self.job.adapter_slot):
            return self._score_next()

    def _score_next(self) -> ScoredAnswer:
        from mlx_lm.models.cache import trim_prompt_cache

        q = self.prepared[len(self.answers)]
        if self.shared is not None:
            logits = _last_logits(self.net, q.ids[self.prefix:], self.shared, split=self.split)
            trim_prompt_cache(self.shared, len(q.ids) - self.prefix)  # back to the shared prefix
        elif self._snapshot is not None:
            cache = restore_cache(self._snapshot, self._cache())
            logits = _last_logits(self.net, q.ids[self.prefix:], cache, split=self.split)
        else:
            prefill = self._prefill(q)
            logits = _last_logits(self.net, q.ids, self._cache(), prefill, None if prefill else self.split)
        [row] = reduce_rows(logits, [q.label_ids], self.state.opener_ids)
        return self.accept(q, row)

    @property
    def batches(self) -> bool:
        """Whether `score_batch` runs the remaining questions in batched passes rather than one
        `score_next` each: text questions only, shared prefix in plain KV caches, or no shared
        prefix (several questions with nothing in common) on a model whose fresh cache is plain."""
        if not self.prefix_reuse or self.job.images or vision_of(self.model) is not None:
            return False
        if self.shared is not None:
            return plain_kv(self.shared)
        if self._snapshot is not None:
            return False
        return len(self.prepared) - len(self.answers) > 1 and plain_kv(self._cache())

    def score_batch(self, max_rows: int | None = None) -> list[ScoredAnswer]:
        """Score the remaining questions, or the next `max_rows` of them; their answers are appended
        to `self.answers` in question order and returned."""
        start = len(self.answers)
        end = len(self.prepared) if max_rows is None else min(len(self.prepared), start + max(max_rows, 0))
        if not self.batches:
            return [self.score_next() for _ in range(start, end)]
        with selected(self.model, self.job.adapter_slot):
            return self._score_rows(self.prepared[start:end])

    def _score_rows(self, questions: Sequence[PreparedQuestion]) -> list[ScoredAnswer]:
        lengths = [len(q.ids) - self.prefix for q in questions]
        # No prefix to copy without a shared cache; the whole prompts' logits then dominate the memory.
        kv_token_bytes = kv_bytes_per_token(self.shared) if self.shared is not None else 0
        scored = []
        for rows in batch_chunks(lengths, self.position_bytes // 4, self.prefix, kv_token_bytes,
                                 self.batch_logits_bytes, self.batch_cache_bytes):
            chunk = [questions[i] for i in rows]
            reduced = reduce_rows(self._batch_logits(chunk), [q.label_ids for q in chunk], self.state.opener_ids)
            scored += [self.accept(q, row) for q, row in zip(chunk, reduced, strict=True)]
        return scored

    def accept(self, q: PreparedQuestion, row: NextToken) -> ScoredAnswer:
        """The answer to `q` (this run's next question) from its reduced last-position logits."""
        if row.opener:
            raise DecisionError(400, REASONING_OPENER_PREDICTED)
        answer = answer_from_logprobs(q.view.kind, logprobs_from_reduction(row.top, row.total, row.labels))
        self.answers.append(answer)
        return answer

    @property
    def joins_others(self) -> bool:
        """Whether this run's questions can share batched passes with other runs on the model: a
        shared prefix held in plain KV caches, and no adapter (whose rows are its own)."""
        return self.batches and self.shared is not None and not self.job.adapter_slot

    def pending(self) -> list[PreparedQuestion]:
        """The questions neither answered nor in a pass still computing (`launched`)."""
        return self.prepared[max(len(self.answers), self.launched):]

    def _batch_logits(self, chunk: Sequence[PreparedQuestion]) -> Any:
        """Last-real-position logits of each question's suffix, [rows, vocab] float32, in one forward
        pass (evaluated)."""
        import mlx.core as mx

        suffixes = [q.ids[self.prefix:] for q in chunk]
        width = max(len(s) for s in suffixes)
        # Right padding: under the causal mask no real token attends to the padding after it.
        tokens = mx.array([s + [0] * (width - len(s)) for s in suffixes])
        rows, columns = mx.arange(len(chunk)), mx.array([len(s) - 1 for s in suffixes])
        logits = None
        if self.shared is not None:
            logits = in_place_logits(self, [(self.shared, len(chunk))], tokens, rows, columns)
        if logits is None:
            cache = tiled_cache(self.shared, len(chunk), width) if self.shared is not None else self._cache()
            logits = logits_at(self.net, self.split, tokens, cache, rows, columns)
        mx.eval(logits)  # before the batch cache is dropped
        return logits

    def result(self) -> DecisionResult:
        return DecisionResult(self.answers, sum(len(q.ids) for q in self.prepared), self.prefix)


def pick_rows(runs: Sequence[DecisionRun], max_rows: int) -> list[tuple[DecisionRun, PreparedQuestion]]:
    """Questions of several runs for one batched pass, as many as keep the pass's logits and its
    prefix caches within the runs' bounds; returned grouped by run (each run's in order), so each
    run's prefix is laid out once (`merged_prefixes`, or in place). Where passes are fused (a GPU's,
    `DecisionState.fused`) whole runs are taken in order, so a request is mostly answered by one
    pass; elsewhere the questions are taken round robin over the runs. Live runs go first: a batch
    job's questions (`DecisionJob.batch`) only fill what the live ones leave of the pass."""
    if runs and runs[0].state.in_place and runs[0].state.fused:
        return _whole_runs(runs, max_rows)
    queues = [list(run.pending()) for run in runs]
    token_bytes = [kv_bytes_per_token(run.shared) for run in runs]
    taken: list[tuple[int, PreparedQuestion]] = []
    width = prefix = 0
    full = False
    tiers = [[r for r, run in enumerate(runs) if run.job.batch == batch] for batch in (False, True)]
    while not full and len(taken) < max_rows and any(queues):
        tier = next(t for t in tiers if any(queues[r] for r in t))  # the batch tier once no live row waits
        for r in tier:
            run, queue = runs[r], queues[r]
            if not queue or len(taken) >= max_rows:
                continue
            q = queue[0]
            w, p = max(width, len(q.ids) - run.prefix), max(prefix, run.prefix)
            n = len(taken) + 1
            if taken and (n * w * run.position_bytes > run.batch_logits_bytes
                          or n * (p + w) * token_bytes[r] > run.batch_cache_bytes):
                full = True
                break
            taken.append((r, queue.pop(0)))
            width, prefix = w, p
    taken.sort(key=lambda row: row[0])  # stable: each run's questions stay in order
    return [(runs[r], q) for r, q in taken]


def _whole_runs(runs: Sequence[DecisionRun], max_rows: int) -> list[tuple[DecisionRun, PreparedQuestion]]:
    """Runs in order with all their pending questions (the last one's first questions where the rest
    would pass `max_rows`), while the pass's logits stay within the bound and its laid-out prefixes
    (one per run, each with its rows' suffixes after it) within the cache bound; the first run at
    least."""
    taken: list[tuple[DecisionRun, PreparedQuestion]] = []
    width = prefix = segments = slots = 0
    for run in runs:
        pending = run.pending()[: max_rows - len(taken)]
        if not pending:
            continue
        w = max(width, *(len(q.ids) - run.prefix for q in pending))
        p, k, c = max(prefix, run.prefix), segments + 1, max(slots, len(pending))
        n = len(taken) + len(pending)
        if taken and (n * w * run.position_bytes > run.batch_logits_bytes
                      or k * (p + c * w) * kv_bytes_per_token(run.shared) > run.batch_cache_bytes):
            break
        taken += [(run, q) for q in pending]
        width, prefix, segments, slots = w, p, k, c
        if len(taken) >= max_rows:
            break
    return taken


def consecutive(runs: Sequence[DecisionRun]) -> list[tuple[DecisionRun, int]]:
    """Each run of a pass's rows, in order, with how many consecutive rows it has."""
    groups: list[tuple[DecisionRun, int]] = []
    for run in runs:
        if groups and groups[-1][0] is run:
            groups[-1] = (run, groups[-1][1] + 1)
        else:
            groups.append((run, 1))
    return groups


def merged_prefixes(runs: Sequence[DecisionRun]) -> list[Any]:
    """One batch cache per layer whose row i holds `runs[i]`'s shared prefix, left-padded to the
    longest (as mlx-lm's `BatchKVCache.merge` lays it out). A run's consecutive rows are one repeat
    of its prefix, so a pass costs a few array operations per run and layer, not one per row."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    groups = consecutive(runs)
    longest = max(run.prefix for run in runs)
    merged = []
    for i in range(len(runs[0].shared)):
        keys, values = [], []
        for run, count in groups:
            for kept, part in zip((keys, values), run.shared[i].keys_and_values(), strict=True):
                if run.prefix < longest:
                    part = mx.pad(part, [(0, 0), (0, 0), (longest - run.prefix, 0), (0, 0)])
                kept.append(mx.repeat(part, count, axis=0) if count > 1 else part)
        layer = BatchKVCache([longest - run.prefix for run in runs])
        layer.keys, layer.values = mx.concatenate(keys), mx.concatenate(values)
        layer.offset = layer.offset + longest
        layer._idx = longest
        merged.append(layer)
    return merged


def in_place_logits(run: DecisionRun, prefixes: list[tuple[list[Any], int]], tokens: Any, rows: Any,
                    columns: Any) -> Any:
    """The pass's logits (lazy) with each segment of rows attending its prefix in place
    (engine/decisions/shared_prefix.py), or None where the model's attention cannot."""
    if not run.state.in_place:
        return None
    caches = shared_prefix.layer_caches(prefixes)
    logits = logits_at(run.net, run.split, tokens, caches, rows, columns)
    if not shared_prefix.attended(caches):
        run.state.in_place = False  # nothing was computed yet: the graph is dropped
        return None
    return logits


def launch_across(rows: Sequence[tuple[DecisionRun, PreparedQuestion]]) -> PendingRows:
    """Reduced last-position logits of questions from different runs on one model (`rows` as
    `pick_rows` gives them), in one forward pass queued on the device and not waited for, so the
    next pass can be prepared while it runs; each run's `launched` counts the rows. Each row's
    suffix is right-padded and attends its own run's shared prefix in place; where a model cannot,
    the prefixes are merged left-padded (as mlx-lm batches caches of different lengths) and the
    masks keep every row to its own tokens. The runs' prefix caches are only read."""
    import mlx.core as mx

    suffixes = [q.ids[run.prefix:] for run, q in rows]
    lengths = [len(s) for s in suffixes]
    first = rows[0][0]
    # A fused pass's width from a small set (see shared_prefix.Layout): padding after a row's last
    # real token is never seen by it.
    width = shared_prefix.round_up(max(lengths), FUSED_WIDTH_STEP) if first.state.fused else max(lengths)
    tokens = mx.array([s + [0] * (width - len(s)) for s in suffixes])
    segments = consecutive([run for run, _ in rows])  # `pick_rows` groups each run's rows
    positions, columns = mx.arange(len(rows)), mx.array([n - 1 for n in lengths])
    logits = in_place_logits(first, [(run.shared, count) for run, count in segments], tokens, positions, columns)
    if logits is None:
        cache = merged_prefixes([run for run, _ in rows])
        for layer in cache:
            layer.prepare(lengths=lengths, right_padding=[width - n for n in lengths])
        logits = logits_at(first.net, first.split, tokens, cache, positions, columns)
    pending = launch_rows(logits, [q.label_ids for _, q in rows], first.state.opener_ids)
    for run, _ in rows:
        run.launched = max(run.launched, len(run.answers)) + 1
    return pending
