"""The label scorer on a loaded model: one engine behind /v1/decisions and /v1/systemone.

Every question is prepared and checked before anything is scored (one refusal refuses the whole
request). Scoring then reads the next-token logits at the answer position. By default the questions
share one prefill of their common prefix (chat-template header plus the input): the prefix's KV
state is computed once and each question's suffix is scored from it. `prefix_reuse=False` gives
every question a fresh cache instead, bit for bit like scoring it alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from swama.engine.model import LoadedModel
from swama.engine.scorer import (
    CHAT_TEMPLATE_REQUIRED,
    DecisionError,
    HFLabelTokenizer,
    QuestionView,
    ScoredAnswer,
    answer_from_logits,
    build_content,
    check_context,
    check_no_reasoning_opener,
    check_reasoning_closed,
    check_round_trip,
    find_pair_labels,
    label_token_ids,
    labels_for,
    reasoning_opener_ids,
)


@dataclass(frozen=True)
class DecisionJob:
    text: str  # the rendered input (decisions) or state (systemone)
    questions: Sequence[QuestionView]
    context_limit: int
    systemone: bool = False  # context refusals carry the System One capacity phrase


@dataclass(frozen=True)
class PreparedQuestion:
    view: QuestionView
    ids: list[int]
    label_ids: list[int]


@dataclass(frozen=True)
class DecisionResult:
    answers: list[ScoredAnswer]
    input_tokens: int
    shared_prefix_tokens: int  # 0 when every question had its own cache


def _render(model: LoadedModel, content: str) -> str:
    return model.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                               enable_thinking=False, tokenize=False)


def _label_tokenizer(model: LoadedModel) -> HFLabelTokenizer:
    if "label_tokenizer" not in model.caches:
        model.caches["label_tokenizer"] = HFLabelTokenizer(model.tokenizer._tokenizer)
    return model.caches["label_tokenizer"]


def _pair_labels(model: LoadedModel) -> Sequence[str] | None:
    if "pair_labels" not in model.caches:
        model.caches["pair_labels"] = find_pair_labels(_label_tokenizer(model), lambda c: _render(model, c))
    return model.caches["pair_labels"]


def _opener_ids(model: LoadedModel) -> list[int]:
    if "opener_ids" not in model.caches:
        model.caches["opener_ids"] = reasoning_opener_ids(_label_tokenizer(model))
    return model.caches["opener_ids"]


def prepare(model: LoadedModel, job: DecisionJob) -> list[PreparedQuestion]:
    if not model.has_chat_template:
        raise DecisionError(400, CHAT_TEMPLATE_REQUIRED)
    tok = _label_tokenizer(model)
    prepared = []
    for view in job.questions:
        labels = labels_for(view, lambda: _pair_labels(model))
        content = build_content(job.text, view, labels)
        prompt = _render(model, content)
        ids = tok.encode(prompt)
        check_context(len(ids), job.context_limit, systemone=job.systemone)
        check_round_trip(tok, ids)
        check_reasoning_closed(prompt, content)
        prepared.append(PreparedQuestion(view, ids, label_token_ids(tok, prompt, ids, labels)))
    return prepared


def common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix every sequence shares, leaving each at least one token to score."""
    if not sequences:
        return 0
    first, n = sequences[0], min(len(s) for s in sequences) - 1
    for i in range(max(n, 0)):
        if any(s[i] != first[i] for s in sequences):
            return i
    return max(n, 0)


def _last_logits(model: LoadedModel, ids: Sequence[int], cache: Any) -> np.ndarray:
    import mlx.core as mx

    logits = model.model(mx.array(ids)[None], cache=cache)[0, -1].astype(mx.float32)
    mx.eval(logits)
    return np.array(logits, copy=False)


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


class DecisionRun:
    """One request's scoring, in steps: `start()` prepares every question and prefills the shared
    prefix; `score_next()` scores one question. Between steps the model can serve other requests
    (the KV state of the prefix belongs to this run), which is how concurrent requests share a
    model fairly."""

    def __init__(self, model: LoadedModel, job: DecisionJob, *, prefix_reuse: bool = True) -> None:
        self.model, self.job, self.prefix_reuse = model, job, prefix_reuse
        self.prepared: list[PreparedQuestion] = []
        self.answers: list[ScoredAnswer] = []
        self.prefix = 0
        self._shared: Any = None  # a trimmable cache holding the shared prefix
        self._snapshot: list[Any] | None = None  # or the prefix state of a cache that cannot be trimmed

    @property
    def done(self) -> bool:
        return len(self.answers) == len(self.prepared)

    def start(self) -> None:
        from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

        self.prepared = prepare(self.model, self.job)
        _opener_ids(self.model)
        if self.prefix_reuse and len(self.prepared) > 1:
            self.prefix = common_prefix([q.ids for q in self.prepared])
        if self.prefix > 0:
            self._shared = make_prompt_cache(self.model.model)
            _last_logits(self.model, self.prepared[0].ids[: self.prefix], self._shared)
            if not can_trim_prompt_cache(self._shared):
                # Recurrent or sliding-window layers cannot be trimmed back to the prefix: keep a
                # snapshot of the prefix state instead and give every question its own copy of it.
                self._snapshot, self._shared = snapshot_cache(self._shared), None

    def score_next(self) -> ScoredAnswer:
        from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

        q = self.prepared[len(self.answers)]
        if self._shared is not None:
            logits = _last_logits(self.model, q.ids[self.prefix:], self._shared)
            trim_prompt_cache(self._shared, len(q.ids) - self.prefix)  # back to the shared prefix
        elif self._snapshot is not None:
            cache = restore_cache(self._snapshot, make_prompt_cache(self.model.model))
            logits = _last_logits(self.model, q.ids[self.prefix:], cache)
        else:
            logits = _last_logits(self.model, q.ids, make_prompt_cache(self.model.model))
        check_no_reasoning_opener(logits, _opener_ids(self.model))
        answer = answer_from_logits(q.view.kind, logits, q.label_ids)
        self.answers.append(answer)
        return answer

    def result(self) -> DecisionResult:
        return DecisionResult(self.answers, sum(len(q.ids) for q in self.prepared), self.prefix)
