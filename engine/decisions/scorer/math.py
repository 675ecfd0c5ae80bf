"""Label log-probabilities, normalisation, label mass, expected score and confidence.

The vocabulary maximum and the sum of exponentials are taken in float32 over the whole vocabulary;
everything after that is double precision, with ``math.fsum`` sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .checks import INVALID_DECISION_LOGITS, INVALID_NEXT_TOKEN_LOGITS, DecisionError

MAX_LABEL_MASS = 1.000001


def label_logprobs(logits: Sequence[float] | np.ndarray, label_ids: Sequence[int]) -> tuple[float, ...]:
    """``z[id] - logsumexp(z)`` per label, from last-position logits ``z`` of shape ``(vocab,)``."""
    try:
        z = np.asarray(logits, dtype=np.float32)
    except (TypeError, ValueError):
        raise DecisionError(500, INVALID_NEXT_TOKEN_LOGITS) from None
    if z.ndim != 1 or z.size == 0:
        raise DecisionError(500, INVALID_NEXT_TOKEN_LOGITS)
    vocab = z.size
    if any(
        isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < vocab for i in label_ids
    ):
        raise DecisionError(500, INVALID_NEXT_TOKEN_LOGITS)
    with np.errstate(all="ignore"):
        top = z.max()
        total = np.sum(np.exp(z - top), dtype=np.float32) if np.isfinite(top) else np.float32("nan")
    return logprobs_from_reduction(float(top), float(total), [float(z[i]) for i in label_ids])


def logprobs_from_reduction(top: float, total: float, label_logits: Sequence[float]) -> tuple[float, ...]:
    """``z[id] - logsumexp(z)`` per label from the vocabulary's float32 maximum ``top``, its float32
    sum of ``exp(z - top)`` and the labels' logits: what a device reduces the logits to."""
    if not math.isfinite(top):
        raise DecisionError(500, INVALID_NEXT_TOKEN_LOGITS)
    # The float32 sum is at least 1 (the maximum's own term). Adding the maximum back in double
    # avoids a float32 rounding of the log-sum-exp (up to 2e-6 at logits near 40) that could push
    # a confident answer's label mass over the 1.000001 sanity bound.
    lse = top + math.log(total) if math.isfinite(total) and total > 0 else math.nan
    if not math.isfinite(lse):
        raise DecisionError(500, INVALID_NEXT_TOKEN_LOGITS)
    return tuple(float(x) - lse for x in label_logits)


def check_label_logprobs(logprobs: Sequence[float]) -> None:
    """Refuse NaN, +inf, all -inf and a label mass outside ``[0, 1.000001]``; -inf alone is fine."""
    values = [float(x) for x in logprobs]
    if not values or any(math.isnan(x) or x == math.inf for x in values) or max(values) == -math.inf:
        raise DecisionError(500, INVALID_DECISION_LOGITS)
    mass = label_mass(values)
    if not 0.0 <= mass <= MAX_LABEL_MASS:
        raise DecisionError(500, INVALID_DECISION_LOGITS)


def label_mass(logprobs: Sequence[float]) -> float:
    """Probability of the labels against the full vocabulary."""
    return math.fsum(math.exp(x) for x in logprobs)


def label_probabilities(logprobs: Sequence[float]) -> tuple[float, ...]:
    """Softmax over the labels only at temperature 1 (the vocabulary normaliser cancels)."""
    top = max(logprobs)
    weights = [math.exp(x - top) for x in logprobs]
    total = math.fsum(weights)
    return tuple(w / total for w in weights)


def first_argmax(values: Sequence[float]) -> int:
    """Index of the first maximum, so ties go to the earlier option."""
    best = 0
    for i, value in enumerate(values):
        if value > values[best]:
            best = i
    return best


def expected_score(probabilities: Sequence[float]) -> float:
    return math.fsum(i * p for i, p in enumerate(probabilities))


def _renormalised(probabilities: Sequence[float]) -> list[float]:
    total = math.fsum(probabilities)
    n = len(probabilities)
    if total <= 0:
        return [1.0 / n] * n
    return [p / total for p in probabilities]


def choice_confidence(probabilities: Sequence[float]) -> float:
    """``clamp((n·max(q) − 1)/(n − 1), 0, 1)``: concentration, not correctness."""
    n = len(probabilities)
    if n <= 1:
        return 1.0
    q = _renormalised(probabilities)
    return min(1.0, max(0.0, (n * max(q) - 1) / (n - 1)))


def score_confidence(probabilities: Sequence[float]) -> float:
    """``max(0, 1 − Σ q_i·|i − m| / U)`` with ``m`` the first mode and ``U`` the uniform spread."""
    n = len(probabilities)
    if n <= 1:
        return 1.0
    q = _renormalised(probabilities)
    mode = first_argmax(q)
    spread = math.fsum(qi * abs(i - mode) for i, qi in enumerate(q))
    uniform = math.fsum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return max(0.0, 1 - spread / uniform)
