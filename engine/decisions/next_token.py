"""Next-token logits reduced on the device to what scoring needs, for a whole batch at once.

A question's answer needs, of its `[vocab]` logits, only the vocabulary maximum, the float32 sum of
`exp(z - max)`, its labels' logits and whether a reasoning opener ties the maximum. All of that is
computed on the device for every row of a pass in a few array operations, so a 152k-token vocabulary
never crosses to the host: each row brings back two numbers, its labels and one flag. The host then
finishes in double precision exactly as `scorer.math.label_logprobs` does on full logits
(`logprobs_from_reduction`); the sum is a float32 sum, in blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from swama.engine.decisions.scorer import DecisionError
from swama.engine.decisions.scorer.checks import INVALID_NEXT_TOKEN_LOGITS


@dataclass(frozen=True)
class NextToken:
    """One row's reduced logits."""

    top: float  # the vocabulary maximum (float32)
    total: float  # the float32 sum of exp(z - top) over the vocabulary
    labels: tuple[float, ...]  # the labels' logits, in the order asked
    opener: bool  # a reasoning opener's logit equals the maximum (ties count)


SUM_BLOCK = 256


def _sum_rows(values: Any) -> Any:
    """Row sums in two levels (blocks of `SUM_BLOCK`, then the blocks): MLX's CPU sum adds in
    sequence, 4e-5 off over a 49k vocabulary, where the blocks keep it near numpy's 1e-7."""
    import mlx.core as mx

    rows, n = values.shape
    padded = mx.pad(values, [(0, 0), (0, -n % SUM_BLOCK)])
    return mx.sum(mx.sum(padded.reshape(rows, -1, SUM_BLOCK), axis=-1), axis=-1)


class PendingRows:
    """A pass's reductions, still computing on the device (`launch_rows`); `rows()` waits for them."""

    def __init__(self, arrays: tuple[Any, Any, Any, Any], counts: list[int]) -> None:
        self.arrays, self.counts = arrays, counts

    def rows(self) -> list[NextToken]:
        import mlx.core as mx

        top, total, labels, opener = self.arrays
        mx.eval(top, total, labels, opener)
        tops, totals = np.array(top[:, 0], copy=False), np.array(total, copy=False)
        values, hits = np.array(labels, copy=False), np.array(opener, copy=False)
        return [NextToken(float(tops[r]), float(totals[r]), tuple(float(x) for x in values[r, :n]), bool(hits[r]))
                for r, n in enumerate(self.counts)]


def launch_rows(logits: Any, label_ids: Sequence[Sequence[int]], opener_ids: Sequence[int]) -> PendingRows:
    """`logits` ([rows, vocab] float32 MLX array, lazy or not) reduced per row, the work queued on
    the device (`mx.async_eval`) and not waited for; `label_ids[i]` are row i's label token ids.
    Label ids outside the vocabulary are a server error, as on the host."""
    import mlx.core as mx

    rows, vocab = logits.shape
    if any(not 0 <= i < vocab for ids in label_ids for i in ids) or not all(label_ids):
        raise DecisionError(500, INVALID_NEXT_TOKEN_LOGITS)
    width = max(len(ids) for ids in label_ids)
    index = mx.array([list(ids) + [ids[0]] * (width - len(ids)) for ids in label_ids], dtype=mx.int32)
    top = mx.max(logits, axis=-1, keepdims=True)
    total = _sum_rows(mx.exp(logits - top))
    labels = mx.take_along_axis(logits, index, axis=-1)
    openers = [i for i in opener_ids if 0 <= i < vocab]
    if openers:
        opener = mx.any(logits[:, mx.array(openers, dtype=mx.int32)] == top, axis=-1)
    else:
        opener = mx.zeros((rows,), dtype=mx.bool_)
    mx.async_eval(top, total, labels, opener)
    return PendingRows((top, total, labels, opener), [len(ids) for ids in label_ids])


def reduce_rows(logits: Any, label_ids: Sequence[Sequence[int]], opener_ids: Sequence[int]) -> list[NextToken]:
    """`launch_rows`, waited for."""
    return launch_rows(logits, label_ids, opener_ids).rows()
