"""Scoring math: label log-probabilities, normalisation, mass, expected score and confidence."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from precision import F64_ARITHMETIC, SIX_DECIMALS

from swama.engine.decisions.scorer import (
    DecisionError,
    ScoredAnswer,
    answer_from_logits,
    answer_from_logprobs,
    check_no_reasoning_opener,
    choice_confidence,
    expected_score,
    first_argmax,
    label_logprobs,
    score_confidence,
)

INVALID_NEXT_TOKEN_LOGITS = "The model returned invalid next-token logits."
INVALID_DECISION_LOGITS = "The model returned invalid decision logits."
# A log, an exp and a sum or a division of values under 1: a few float64 roundings of u = 1.1e-16 each.
FEW_ROUNDINGS = 1e-15


def _lp(probabilities: Sequence[float], scale: float = 0.6) -> list[float]:
    return [math.log(scale * p) if p > 0 else -math.inf for p in probabilities]


def _server_error(call: Callable[[], object]) -> str:
    with pytest.raises(DecisionError) as caught:
        call()
    assert (caught.value.status, caught.value.type) == (500, "server_error")
    return caught.value.message


# Confidence table (fed in as lp = log(0.6·p)) ------------------------------------------------

THIRD = 1 / 3


@pytest.mark.parametrize(
    ("probabilities", "choice", "score"),
    [
        ([0.5, 0.5], 0, 0),
        ([THIRD, THIRD, THIRD], 0, 0),
        ([1, 0, 0], 1, 1),
        ([0, 1, 0], 1, 1),
        ([0.7, 0.2, 0.1], 0.55, 0.4),
        ([0.1, 0.2, 0.4, 0.2, 0.1], 0.25, THIRD),
        ([0.6, 0.2, 0.1, 0.05, 0.05], 0.5, 0.375),
        ([0.4, 0.4, 0.1, 0.1], 0.2, 0.1),
        ([0.1, 0.1, 0.4, 0.4], 0.2, 0.3),
        ([0.34, 0, 0.33, 0, 0.33], 0.175, 0),
    ],
)
def test_confidence_table(probabilities: list[float], choice: float, score: float) -> None:
    lp = _lp(probabilities)
    choice_answer = answer_from_logprobs("choice", lp)
    score_answer = answer_from_logprobs("score", lp)
    assert choice_answer.confidence == pytest.approx(choice, abs=F64_ARITHMETIC)
    assert score_answer.confidence == pytest.approx(score, abs=F64_ARITHMETIC)
    assert choice_answer.mass == pytest.approx(0.6, abs=F64_ARITHMETIC)
    assert choice_answer.probabilities == pytest.approx(probabilities, abs=F64_ARITHMETIC)


# More math cases -----------------------------------------------------------------------------


def test_small_label_mass_keeps_the_confidence() -> None:
    lp = _lp([0.7, 0.2, 0.1], scale=0.01)
    answer = answer_from_logprobs("choice", lp)
    assert answer.confidence == pytest.approx(0.55, abs=F64_ARITHMETIC)
    assert answer.mass == pytest.approx(0.01, abs=FEW_ROUNDINGS)


def test_minus_infinity_labels_are_allowed() -> None:
    answer = answer_from_logprobs("choice", [math.log(0.001), -math.inf, -math.inf])
    assert answer.probabilities == (1.0, 0.0, 0.0)
    assert answer.confidence == 1.0
    assert answer.mass == pytest.approx(0.001, abs=FEW_ROUNDINGS)


def test_yes_no_probability_is_conditional_on_the_two_labels() -> None:
    answer = answer_from_logprobs("yes_no", [math.log(0.377), math.log(0.095)])
    assert answer.mass == pytest.approx(0.472, abs=FEW_ROUNDINGS)
    assert answer.p_yes == pytest.approx(0.377 / 0.472, abs=FEW_ROUNDINGS)
    assert answer.probabilities[1] == pytest.approx(0.095 / 0.472, abs=FEW_ROUNDINGS)
    assert (answer.kind, answer.confidence, answer.score, answer.choice_index) == ("yes_no", None, None, 0)


def test_expected_score_is_exact() -> None:
    answer = answer_from_logprobs("score", [math.log(0.1), math.log(0.2), math.log(0.1)])
    assert answer.score == 1.0
    assert answer.choice_index == 1


def test_ties_go_to_the_first_option() -> None:
    assert answer_from_logprobs("choice", [math.log(0.2), math.log(0.3), math.log(0.3)]).choice_index == 1
    assert answer_from_logprobs("choice", [math.log(0.25)] * 4).choice_index == 0
    assert first_argmax([0.1, 0.5, 0.5, 0.2]) == 1
    assert score_confidence([0.4, 0.4, 0.1, 0.1]) == pytest.approx(0.1, abs=F64_ARITHMETIC)  # mode 0, not 1


@pytest.mark.parametrize(
    "logprobs",
    [
        [math.nan, math.log(0.1)],
        [math.inf, math.log(0.1)],
        [-math.inf, -math.inf],
        [0.0, 0.0],
        [math.log(0.6), math.log(0.5)],
        [],
    ],
    ids=["nan", "inf", "all-minus-inf", "mass-2", "mass-1.1", "empty"],
)
def test_invalid_label_logprobs_are_server_errors(logprobs: list[float]) -> None:
    assert _server_error(lambda: answer_from_logprobs("choice", logprobs)) == INVALID_DECISION_LOGITS


def test_mass_bound_is_1_000001() -> None:
    assert answer_from_logprobs("yes_no", [math.log(0.5), math.log(0.5000009)]).mass <= 1.000001
    over = [math.log(0.5), math.log(0.5000011)]
    assert _server_error(lambda: answer_from_logprobs("yes_no", over)) == INVALID_DECISION_LOGITS


# SGLang's confidence cases -------------------------------------------------------------------


def test_sglang_confidence_cases() -> None:
    assert score_confidence([0, 0.14, 0.86, 0, 0]) == pytest.approx(1 - 0.14 / 1.2, abs=F64_ARITHMETIC)
    assert score_confidence([0, 0, 0.48, 0.52]) == pytest.approx(0.52, abs=F64_ARITHMETIC)
    assert score_confidence([0.5, 0, 0, 0, 0.5]) == 0
    assert choice_confidence([0.25] * 4) == pytest.approx(0, abs=F64_ARITHMETIC)
    assert choice_confidence([0.1, 0.9]) == pytest.approx(0.8, abs=F64_ARITHMETIC)
    assert choice_confidence([1.0]) == score_confidence([1.0]) == 1.0


def test_confidence_renormalises_and_handles_zero_sums() -> None:
    assert choice_confidence([0.35, 0.1, 0.05]) == pytest.approx(0.55, abs=F64_ARITHMETIC)
    assert choice_confidence([0.0, 0.0]) == 0.0
    assert score_confidence([0.0, 0.0, 0.0]) == 0.0


# Stub backend: lp_i = log(0.6/(i+2)) --------------------------------------------------------


def _stub(n: int) -> list[float]:
    return [math.log(0.6 / (i + 2)) for i in range(n)]


def test_stub_backend_two_labels() -> None:
    answer = answer_from_logprobs("yes_no", _stub(2))
    assert answer.probabilities == pytest.approx([0.6, 0.4], abs=F64_ARITHMETIC)
    assert answer.mass == pytest.approx(0.5, abs=F64_ARITHMETIC)


def test_stub_backend_three_labels() -> None:
    choice = answer_from_logprobs("choice", _stub(3))
    score = answer_from_logprobs("score", _stub(3))
    assert choice.probabilities == pytest.approx([0.461538, 0.307692, 0.230769], abs=SIX_DECIMALS)
    assert choice.mass == pytest.approx(0.65, abs=F64_ARITHMETIC)
    assert choice.confidence == pytest.approx(0.192308, abs=SIX_DECIMALS)
    assert score.score == pytest.approx(0.769231, abs=SIX_DECIMALS)
    assert score.confidence == 0


# Raw logits (bf16 values read from Qwen3.5-0.8B) -------------------------------------------


def _vocab_with(
    label_logits: Sequence[float], size: int = 4096, seed: int = 0
) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    z = rng.normal(-4.0, 2.0, size).astype(np.float32)
    ids = [17 + 101 * i for i in range(len(label_logits))]
    z[ids] = label_logits
    return z, ids


def test_raw_logits_yes_no() -> None:
    z, ids = _vocab_with([24.25, 22.875])
    assert answer_from_logits("yes_no", z, ids).p_yes == pytest.approx(0.798187, abs=SIX_DECIMALS)


def test_raw_logits_choice() -> None:
    z, ids = _vocab_with([29.5, 26.375, 23.5])
    answer = answer_from_logits("choice", z, ids)
    assert answer.probabilities == pytest.approx([0.955643, 0.041988, 0.002369], abs=SIX_DECIMALS)
    assert answer.choice_index == 0
    assert answer.confidence == pytest.approx(0.933465, abs=SIX_DECIMALS)


def test_raw_logits_score() -> None:
    z, ids = _vocab_with([21.75, 23.25, 22.375, 21.75, 20.125])
    answer = answer_from_logits("score", z, ids)
    assert answer.probabilities == pytest.approx([0.117002, 0.524368, 0.218589, 0.117002, 0.023039], abs=SIX_DECIMALS)
    assert answer.score == pytest.approx(1.404708, abs=SIX_DECIMALS)
    assert answer.confidence == pytest.approx(0.467739, abs=SIX_DECIMALS)


def test_label_logprobs_are_against_the_full_vocabulary() -> None:
    z, ids = _vocab_with([3.0, 1.5, -2.0], size=50_000, seed=3)
    reference = np.logaddexp.reduce(z.astype(np.float64))
    lp = label_logprobs(z, ids)
    # numpy sums the 50,000 float32 exps pairwise (under 30 roundings deep: 1.8e-6 relative) and each
    # exp's argument rounds by under 5e-7: the log-sum-exp is off by under 3e-6.
    assert lp == pytest.approx([float(z[i]) - reference for i in ids], abs=1e-5)
    assert all(isinstance(x, float) for x in lp)
    # float32 sums 1 + 1 exactly; the log is taken in float64.
    assert label_logprobs([0.0, 0.0], [0, 1]) == pytest.approx([-math.log(2)] * 2, abs=F64_ARITHMETIC)


def test_probabilities_do_not_depend_on_the_rest_of_the_vocabulary() -> None:
    low, ids = _vocab_with([2.0, 1.0], seed=1)
    high = low.copy()
    high[1000:1010] = 30.0
    a, b = answer_from_logits("yes_no", low, ids), answer_from_logits("yes_no", high, ids)
    assert a.probabilities == pytest.approx(b.probabilities, abs=F64_ARITHMETIC)
    assert b.mass < 1e-10 < a.mass  # e^2 + e against ten logits of 30: 1e-13; against the rest: about 0.02


def _with(z: np.ndarray, index: int, value: float) -> np.ndarray:
    z = z.copy()
    z[index] = value
    return z


@pytest.mark.parametrize(
    ("logits", "ids"),
    [
        (_with(_vocab_with([1.0, 2.0])[0], 5, np.nan), [17, 118]),
        (_with(_vocab_with([1.0, 2.0])[0], 5, np.inf), [17, 118]),
        (np.full(8, -np.inf, dtype=np.float32), [0, 1]),
        (np.zeros(8, dtype=np.float32), [0, 8]),
        (np.zeros(8, dtype=np.float32), [-1, 1]),
        (np.zeros(8, dtype=np.float32), [0, 1.0]),
        (np.zeros(8, dtype=np.float32), [True, 2]),
        (np.zeros((1, 8), dtype=np.float32), [0, 1]),
        (np.zeros(0, dtype=np.float32), [0, 1]),
        (["a", "b"], [0, 1]),
    ],
    ids=[
        "nan",
        "inf",
        "all-minus-inf",
        "id-too-large",
        "id-negative",
        "id-float",
        "id-bool",
        "2d",
        "empty",
        "text",
    ],
)
def test_invalid_logits_are_server_errors(logits: object, ids: list[int]) -> None:
    def score() -> ScoredAnswer:
        return answer_from_logits("choice", logits, ids)  # type: ignore[arg-type]

    assert _server_error(score) == INVALID_NEXT_TOKEN_LOGITS


def test_minus_infinity_in_the_vocabulary_is_fine() -> None:
    z = np.array([-np.inf, 1.0, 1.0, -np.inf], dtype=np.float32)
    assert answer_from_logits("choice", z, [1, 2, 0]).probabilities == (0.5, 0.5, 0.0)


# Reasoning opener at the vocabulary maximum ------------------------------------------------------


def test_reasoning_opener_at_the_maximum_is_refused() -> None:
    z = np.array([1.0, 5.0, 3.0, 5.0], dtype=np.float32)
    for opener in ([1], [3], [0, 3]):
        with pytest.raises(DecisionError) as caught:
            check_no_reasoning_opener(z, opener)
        assert (caught.value.status, caught.value.message) == (
            400,
            "The model predicts a reasoning opener instead of a direct answer.",
        )
    check_no_reasoning_opener(z, [0, 2])
    check_no_reasoning_opener(z, [])
    check_no_reasoning_opener(z, [99])
    check_no_reasoning_opener(np.array([np.nan, 1.0], dtype=np.float32), [1])  # left to the logit check


# Documented example: its printed probabilities reproduce the printed confidence and score -------------


def test_documented_example_consistency() -> None:
    team = [0.9478362250325003, 0.047189986937231164, 0.004973788030268673]
    urgency = [0.015163456120649954, 0.04670673303065524, 0.9381298108486948]
    boolean = [0.5621765008857981, 0.4378234991142019]
    assert choice_confidence(team) == 0.9217543375487502
    assert score_confidence(urgency) == 0.8844495320920672
    assert expected_score(urgency) == 1.922966354728045
    assert choice_confidence(boolean) == 0.12435300177159614
    assert first_argmax(team) == 0 and first_argmax(boolean) == 0


def test_scored_answer_is_frozen() -> None:
    answer = answer_from_logprobs("yes_no", _stub(2))
    assert isinstance(answer, ScoredAnswer)
    with pytest.raises(AttributeError):
        answer.mass = 0.0  # type: ignore[misc]
