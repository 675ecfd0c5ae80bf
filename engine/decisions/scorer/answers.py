"""The route-neutral result of one scored question."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .math import (
    check_label_logprobs,
    choice_confidence,
    expected_score,
    first_argmax,
    label_logprobs,
    label_mass,
    label_probabilities,
    score_confidence,
)
from .questions import QuestionKind


@dataclass(frozen=True)
class ScoredAnswer:
    """Probabilities are in request order (``yes`` then ``no`` for yes/no questions).

    ``choice_index`` is the first option with the highest probability. ``score`` is set for score
    questions only and ``confidence`` for choice and score questions only. ``mass`` is the labels'
    probability against the full vocabulary (None from a decision checkpoint, whose head scores only
    the answers).
    """

    kind: QuestionKind
    probabilities: tuple[float, ...]
    choice_index: int
    score: float | None
    confidence: float | None
    mass: float | None

    @property
    def p_yes(self) -> float:
        return self.probabilities[0]


def answer_from_logprobs(kind: QuestionKind, logprobs: Sequence[float]) -> ScoredAnswer:
    """Score one question from its label log-probabilities (labels in request order)."""
    check_label_logprobs(logprobs)
    lp = [float(x) for x in logprobs]
    probabilities = label_probabilities(lp)
    score = expected_score(probabilities) if kind == "score" else None
    if kind == "choice":
        confidence: float | None = choice_confidence(probabilities)
    elif kind == "score":
        confidence = score_confidence(probabilities)
    else:
        confidence = None
    return ScoredAnswer(
        kind=kind,
        probabilities=probabilities,
        choice_index=first_argmax(probabilities),
        score=score,
        confidence=confidence,
        mass=label_mass(lp),
    )


def answer_from_logits(
    kind: QuestionKind, logits: Sequence[float] | np.ndarray, label_ids: Sequence[int]
) -> ScoredAnswer:
    """Score one question from the last-position logits over the whole vocabulary."""
    return answer_from_logprobs(kind, label_logprobs(logits, label_ids))
