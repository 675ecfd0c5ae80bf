"""Logits reduced on the device (engine/decisions/next_token.py) score as full logits do on the host."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from precision import f32_reordered

from swama.engine.decisions.next_token import reduce_rows
from swama.engine.decisions.scorer import DecisionError, label_logprobs, logprobs_from_reduction


def test_rows_reduce_to_the_host_logprobs():
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(5, 49_152)) * 4).astype(np.float32)
    labels = [[10, 20], [1, 2, 3, 4], [49_151], [7, 7], list(range(100, 126))]
    rows = reduce_rows(mx.array(logits), labels, opener_ids=[])
    for z, ids, row in zip(logits, labels, rows, strict=True):
        host = label_logprobs(z, ids)
        device = logprobs_from_reduction(row.top, row.total, row.labels)
        assert len(device) == len(ids)
        # The device's and numpy's float32 sums of 49,152 exps in another order: the log-sum-exp moves
        # by their relative gap (measured 7e-7).
        assert np.allclose(device, host, rtol=0, atol=f32_reordered(1, logits.shape[1]))
        assert row.top == float(z.max()) and not row.opener


def test_a_reasoning_opener_at_the_maximum_is_flagged():
    logits = np.zeros((3, 50), dtype=np.float32)
    logits[0, 7] = 5.0  # the opener is the maximum
    logits[1, 9] = 5.0  # another token is
    logits[2, [7, 9]] = 5.0  # a tie counts
    rows = reduce_rows(mx.array(logits), [[1, 2]] * 3, opener_ids=[7, 99])  # 99: outside, ignored
    assert [r.opener for r in rows] == [True, False, True]


def test_label_ids_outside_the_vocabulary_are_a_server_error():
    with pytest.raises(DecisionError) as caught:
        reduce_rows(mx.zeros((1, 10)), [[3, 10]], opener_ids=[])
    assert caught.value.status == 500


def test_non_finite_logits_are_a_server_error():
    rows = reduce_rows(mx.array([[0.0, np.inf, 1.0]]), [[0, 2]], opener_ids=[])
    with pytest.raises(DecisionError) as caught:
        logprobs_from_reduction(rows[0].top, rows[0].total, rows[0].labels)
    assert caught.value.status == 500
