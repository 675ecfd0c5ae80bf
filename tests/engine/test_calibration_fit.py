"""Fitting a temperature and measuring calibration (engine/decisions/adjust/fit.py), on synthetic
answers whose right calibration is known and on cases small enough to compute by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from precision import F64_ARITHMETIC

from swama.engine.decisions.adjust.fit import (
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    accuracy,
    apply_temperature,
    brier_score,
    expected_calibration_error,
    fit_temperature,
    reliability_bins,
)


def tempered_sample(temperature: float, rows: int, options: int, seed: int) -> tuple[list[list[float]], list[int]]:
    """Log-probability rows whose gold options are drawn from softmax(logs / temperature): the
    temperature that calibrates them is `temperature`."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.5, size=(rows, options))
    logs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    true = np.exp(logs / temperature)
    true /= true.sum(axis=1, keepdims=True)
    gold = [int(rng.choice(options, p=p)) for p in true]
    return logs.tolist(), gold


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.5])
def test_the_fit_recovers_the_temperature_the_answers_were_drawn_with(temperature: float) -> None:
    logs, gold = tempered_sample(temperature, 6000, 4, seed=7)
    fitted = fit_temperature(logs, gold)
    # 6,000 draws: over 40 seeds the fit's relative standard error is about 0.02; 0.08 is four of them.
    assert fitted == pytest.approx(temperature, rel=0.08)
    assert fit_temperature(logs, gold) == fitted  # deterministic


def test_the_fit_takes_rows_of_different_option_counts_and_unnormalised_logs() -> None:
    two, gold_two = tempered_sample(2.0, 3000, 2, seed=1)
    five, gold_five = tempered_sample(2.0, 3000, 5, seed=2)
    shifted = [[x + 3.0 for x in row] for row in five]  # softmax ignores a shift of a whole row
    # 6,000 draws: over 40 seeds the fit's relative standard error is about 0.016; 0.08 is five of them.
    assert fit_temperature(two + shifted, gold_two + gold_five) == pytest.approx(2.0, rel=0.08)


def test_the_fit_is_the_minimum_of_the_likelihood() -> None:
    logs, gold = tempered_sample(1.7, 500, 3, seed=3)
    fitted = fit_temperature(logs, gold)

    def nll(t: float) -> float:
        return -sum(math.log(apply_temperature([math.exp(x) for x in row], t)[g]) for row, g in zip(logs, gold, strict=True))

    assert nll(fitted) <= nll(fitted * 1.05) and nll(fitted) <= nll(fitted / 1.05)


def test_always_right_answers_sharpen_to_the_lower_bound_and_always_wrong_ones_flatten_to_the_upper() -> None:
    right = [[math.log(0.7), math.log(0.3)]] * 20
    # The grid holds both bounds, and the search stops within 1e-7 of log T (of T, relatively).
    assert fit_temperature(right, [0] * 20) == pytest.approx(MIN_TEMPERATURE, rel=1e-6)
    assert fit_temperature(right, [1] * 20) == pytest.approx(MAX_TEMPERATURE, rel=1e-6)


def test_the_fit_refuses_what_it_cannot_fit() -> None:
    with pytest.raises(ValueError):
        fit_temperature([], [])
    with pytest.raises(ValueError):
        fit_temperature([[0.0, -1.0]], [2])
    with pytest.raises(ValueError):
        fit_temperature([[0.0, -1.0]], [0, 1])


def test_apply_temperature() -> None:
    p = (0.6, 0.3, 0.1)
    assert apply_temperature(p, 1.0) == pytest.approx(p, abs=F64_ARITHMETIC)
    # T = 0.5 squares and renormalises: 0.36, 0.09, 0.01 over 0.46.
    assert apply_temperature(p, 0.5) == pytest.approx((0.36 / 0.46, 0.09 / 0.46, 0.01 / 0.46), abs=F64_ARITHMETIC)
    flat = apply_temperature(p, 1e6)
    # The logs over 1e6 lie within 2e-6 of each other: each probability within 1e-6 of a third.
    assert flat == pytest.approx((1 / 3, 1 / 3, 1 / 3), abs=1e-5)
    assert apply_temperature((1.0, 0.0), 2.0)[1] > 0  # a zero stays finite, tiny
    with pytest.raises(ValueError):
        apply_temperature(p, 0.0)


def test_brier_score_by_hand() -> None:
    # (0.8-1)^2 + 0.2^2 = 0.08; (0.5-0)^2 + (0.3-1)^2 + 0.2^2 = 0.25 + 0.49 + 0.04 = 0.78
    assert brier_score([(0.8, 0.2), (0.5, 0.3, 0.2)], [0, 1]) == pytest.approx((0.08 + 0.78) / 2, abs=F64_ARITHMETIC)
    assert brier_score([(1.0, 0.0)], [0]) == 0.0
    assert brier_score([(1.0, 0.0)], [1]) == pytest.approx(2.0, abs=F64_ARITHMETIC)


def test_expected_calibration_error_by_hand() -> None:
    rows = [(0.95, 0.05), (0.92, 0.08), (0.35, 0.65), (0.6, 0.4), (0.62, 0.38)]
    gold = [0, 1, 1, 0, 1]
    # Bin [0.9, 1]: confidences 0.95, 0.92 (mean 0.935), one right: |0.5 - 0.935| = 0.435, weight 2/5.
    # Bin [0.6, 0.7): 0.65, 0.6, 0.62 (mean 0.623...), two right: |2/3 - 0.6233| = 0.0433, weight 3/5.
    high = abs(0.5 - 0.935) * 2 / 5
    middle = abs(2 / 3 - (0.65 + 0.6 + 0.62) / 3) * 3 / 5
    assert expected_calibration_error(rows, gold) == pytest.approx(high + middle, abs=F64_ARITHMETIC)
    assert accuracy(rows, gold) == pytest.approx(3 / 5, abs=F64_ARITHMETIC)
    # Perfectly calibrated: 0.75 confidence, three of four right.
    assert expected_calibration_error([(0.75, 0.25)] * 4, [0, 0, 0, 1]) == pytest.approx(0.0, abs=F64_ARITHMETIC)
    assert expected_calibration_error([(0.75, 0.25)] * 4, [1, 1, 1, 1]) == pytest.approx(0.75, abs=F64_ARITHMETIC)


def test_reliability_bins() -> None:
    found = reliability_bins([(0.95, 0.05), (0.55, 0.45), (1.0, 0.0), (0.5, 0.5)], [0, 1, 0, 0], bins=10)
    assert len(found) == 10 and [b.lower for b in found][:2] == [0.0, 0.1]
    assert [b.count for b in found] == [0, 0, 0, 0, 0, 2, 0, 0, 0, 2]
    assert found[9].confidence == pytest.approx(0.975, abs=F64_ARITHMETIC) and found[9].accuracy == 1.0  # 1.0 sits in the last bin
    assert found[5].confidence == pytest.approx(0.525, abs=F64_ARITHMETIC) and found[5].accuracy == 0.5  # a tie picks the first
    assert math.isnan(found[0].confidence)


def test_temperature_scaling_lowers_the_error_of_overconfident_answers() -> None:
    logs, gold = tempered_sample(3.0, 4000, 3, seed=11)  # the raw answers are far too sure
    raw = [[math.exp(x) for x in row] for row in logs]
    t = fit_temperature(logs, gold)
    scaled = [apply_temperature(row, t) for row in raw]
    # 4,000 answers: the fitted ECE is sampling noise (0.009 to 0.02 over 20 seeds), the raw one about 0.22.
    assert expected_calibration_error(scaled, gold) < 0.5 * expected_calibration_error(raw, gold)
    assert brier_score(scaled, gold) < brier_score(raw, gold)
    assert accuracy(scaled, gold) == accuracy(raw, gold)  # one temperature keeps every argmax
