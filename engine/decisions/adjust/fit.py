"""Fitting and measuring a calibration on labelled answers (what `swama calibrate` does with them).

`fit_temperature` finds the temperature T that makes softmax(log p / T) fit the gold answers best
(the least mean negative log-likelihood); `apply_temperature` applies one, as `fitted` does in the
engine. `expected_calibration_error`, `brier_score` and `reliability_bins` measure how well a set
of answers' probabilities match how often they are right. Plain numpy, no model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .plan import LOG_FLOOR

MIN_TEMPERATURE, MAX_TEMPERATURE = 0.05, 20.0
_GRID = 97  # log-spaced temperatures tried before the golden-section refinement
_GOLDEN = (math.sqrt(5) - 1) / 2


def _checked(rows: Sequence[Sequence[float]], gold: Sequence[int]) -> None:
    if len(rows) != len(gold):
        raise ValueError(f"{len(rows)} rows of probabilities but {len(gold)} gold answers")
    if not rows:
        raise ValueError("no answers to fit or measure")
    for row, g in zip(rows, gold, strict=True):
        if len(row) < 2:
            raise ValueError("every answer needs at least two options")
        if not 0 <= g < len(row):
            raise ValueError(f"gold answer {g} is not an option of a row of {len(row)}")


def _groups(rows: Sequence[Sequence[float]], gold: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The rows as arrays, one per option count (rows of one length stack), with their gold indices."""
    by_length: dict[int, tuple[list[Sequence[float]], list[int]]] = {}
    for row, g in zip(rows, gold, strict=True):
        found = by_length.setdefault(len(row), ([], []))
        found[0].append(row)
        found[1].append(int(g))
    return [(np.asarray(r, dtype=np.float64), np.asarray(g, dtype=np.intp)) for r, g in by_length.values()]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = x.max(axis=1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=1, keepdims=True))


def _mean_nll(groups: Sequence[tuple[np.ndarray, np.ndarray]], temperature: float) -> float:
    total, count = 0.0, 0
    for logs, g in groups:
        tempered = _log_softmax(logs / temperature)
        total -= float(tempered[np.arange(len(g)), g].sum())
        count += len(g)
    return total / count


def fit_temperature(logprob_rows: Sequence[Sequence[float]], gold: Sequence[int], *,
                    bounds: tuple[float, float] = (MIN_TEMPERATURE, MAX_TEMPERATURE)) -> float:
    """The temperature T within `bounds` that minimises the mean negative log-likelihood of the gold
    options under softmax(logs / T), one row of (possibly unnormalised) log-probabilities per answer.

    Searched on log T: a fixed grid, then golden-section search between the best grid point's
    neighbours (the likelihood is unimodal in T), so the same data always gives the same T."""
    _checked(logprob_rows, gold)
    low, high = (math.log(b) for b in bounds)
    if not low < high:
        raise ValueError(f"empty temperature bounds {bounds}")
    groups = [(np.maximum(np.nan_to_num(logs, nan=math.log(LOG_FLOOR), neginf=math.log(LOG_FLOOR)),
                          math.log(LOG_FLOOR)), g) for logs, g in _groups(logprob_rows, gold)]

    def loss(log_t: float) -> float:
        return _mean_nll(groups, math.exp(log_t))

    grid = np.linspace(low, high, _GRID)
    losses = [loss(float(x)) for x in grid]
    best = int(np.argmin(losses))
    a, b = float(grid[max(best - 1, 0)]), float(grid[min(best + 1, _GRID - 1)])
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = loss(c), loss(d)
    while b - a > 1e-7:
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = loss(d)
    found = min(((losses[best], float(grid[best])), (fc, c), (fd, d)))[1]
    return math.exp(found)


def apply_temperature(probabilities: Sequence[float], temperature: float) -> tuple[float, ...]:
    """softmax(log p / T): the probabilities sharpened (T < 1) or flattened (T > 1)."""
    if not temperature > 0:
        raise ValueError(f"the temperature must be positive, not {temperature}")
    logs = np.log(np.maximum(np.asarray(probabilities, dtype=np.float64), LOG_FLOOR))
    return tuple(float(p) for p in np.exp(_log_softmax(logs[None, :] / temperature)[0]))


def _top(probability_rows: Sequence[Sequence[float]], gold: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each answer's top-label confidence and whether that label (the first highest) is the gold one."""
    _checked(probability_rows, gold)
    confidence = np.array([max(row) for row in probability_rows], dtype=np.float64)
    correct = np.array([int(np.argmax(row)) == g for row, g in zip(probability_rows, gold, strict=True)])
    return confidence, correct


@dataclass(frozen=True)
class ReliabilityBin:
    """One confidence bin [lower, upper) (the last one closed): its answers' mean top-label
    confidence and how many of them were right."""

    lower: float
    upper: float
    count: int
    confidence: float  # mean top-label confidence (nan when empty)
    accuracy: float  # fraction right (nan when empty)


def reliability_bins(probability_rows: Sequence[Sequence[float]], gold: Sequence[int],
                     bins: int = 10) -> list[ReliabilityBin]:
    """The answers sorted into `bins` equal-width bins of top-label confidence over [0, 1]."""
    if bins < 1:
        raise ValueError("at least one bin is needed")
    confidence, correct = _top(probability_rows, gold)
    index = np.minimum((confidence * bins).astype(np.intp), bins - 1)
    found = []
    for k in range(bins):
        inside = index == k
        count = int(inside.sum())
        found.append(ReliabilityBin(k / bins, (k + 1) / bins, count,
                                    float(confidence[inside].mean()) if count else math.nan,
                                    float(correct[inside].mean()) if count else math.nan))
    return found


def expected_calibration_error(probability_rows: Sequence[Sequence[float]], gold: Sequence[int],
                               bins: int = 10) -> float:
    """ECE: over equal-width bins of top-label confidence, |accuracy - mean confidence| weighted by
    the share of answers in the bin."""
    total = len(gold)
    return math.fsum(b.count / total * abs(b.accuracy - b.confidence)
                     for b in reliability_bins(probability_rows, gold, bins) if b.count)


def brier_score(probability_rows: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    """The multi-class Brier score: the mean over answers of sum over options of (p - 1[gold])^2."""
    _checked(probability_rows, gold)
    return math.fsum(
        math.fsum((p - (1.0 if j == g else 0.0)) ** 2 for j, p in enumerate(row))
        for row, g in zip(probability_rows, gold, strict=True)
    ) / len(gold)


def accuracy(probability_rows: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    """The fraction of answers whose (first) most probable option is the gold one."""
    return float(_top(probability_rows, gold)[1].mean())
