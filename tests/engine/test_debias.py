"""Option-order debiasing and calibration (engine/decisions/adjust) on SmolLM2's real weights, through
the engine's one decision door: permute is invariant to cyclic reordering, prior is estimated then
applied in one pass, contextual divides out a content-free answer scored once, fitted applies the
stored temperature, and a job that asks for nothing is the scorer's result untouched."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from conftest import SMOLLM2_ID, make_store
from precision import BF16_NEAR_TIE, BF16_PROBABILITY, F32_LOGPROB, F32_PROBABILITY, F64_ARITHMETIC, tol

from swama.engine.client import (
    Adjustment,
    CalibrationFile,
    DecisionError,
    DecisionJob,
    DecisionResult,
    EngineSettings,
    Prior,
    decision_choice_view,
    decision_score_view,
    open_engine,
    predicate_view,
    write_calibration,
)
from swama.engine.decisions.adjust.methods import MAX_ORDERS, PRIOR_SAMPLE
from swama.engine.decisions.adjust.plan import (
    arranged,
    averaged_over_orders,
    canonical_order,
    debiasing_orders,
    order_shifts,
    position_prior,
    shifted,
)

# Shifted orders are scored in one batched pass; the same question alone in another pass rounds its
# logits apart (float32: another summation order, see tests/precision.py).
BOUND = tol(F32_PROBABILITY, BF16_PROBABILITY)
# Relative: the label mass sums label probabilities, each moved by a factor of at most
# e^(a log-probability's bound).
MASS_RTOL = tol(math.exp(F32_LOGPROB) - 1, math.exp(BF16_NEAR_TIE) - 1)
INPUT = "The parcel arrived two weeks late and the box was crushed, but the seller refunded me at once."
TEAM = decision_choice_view("Which team should read this?", [("shipping", "deliveries"), ("billing", None),
                                                              ("sales", None), ("support", "anything else")])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A store of its own: the tests write a calibration file into SmolLM2's folder."""
    return make_store(tmp_path_factory, "debias-store", {SMOLLM2_ID: smollm2_dir})


@pytest.fixture
def engine(store: Path) -> Iterator:
    yield open_engine(EngineSettings(models_root=store))


def decide(engine, questions: Sequence, adjustments: Sequence[Adjustment] = (), text: str = INPUT) -> DecisionResult:
    async def run() -> DecisionResult:
        job = DecisionJob(text, list(questions), context_limit=4096, adjustments=list(adjustments))
        async for result in engine.decide(SMOLLM2_ID, job):
            return result
        raise AssertionError("no result")

    return asyncio.run(run())


def close(a: Sequence[float], b: Sequence[float], bound: float = BOUND) -> bool:
    return all(abs(x - y) <= bound for x, y in zip(a, b, strict=True))


# -- the math, without a model -----------------------------------------------------------------------


def test_orders_depend_only_on_the_set_of_options() -> None:
    assert order_shifts(3) == (0, 1, 2)
    assert order_shifts(MAX_ORDERS) == tuple(range(MAX_ORDERS))
    many = order_shifts(20)
    assert len(many) == MAX_ORDERS and many[0] == 0 and len(set(many)) == MAX_ORDERS
    view = shifted(TEAM, 1)
    assert view.option_names == ("billing", "sales", "support", "shipping")
    assert view.option_details == ("", "", "anything else", "deliveries")
    assert canonical_order(TEAM) == (1, 2, 0, 3)  # billing, sales, shipping, support
    shown = {tuple(arranged(TEAM, o).option_names) for o in debiasing_orders(TEAM)}
    for order in itertools.permutations(range(4)):
        other = arranged(TEAM, order)
        assert {tuple(arranged(other, o).option_names) for o in debiasing_orders(other)} == shown
    for o in debiasing_orders(TEAM):  # every option takes every position once
        assert sorted(o) == [0, 1, 2, 3]
    assert {o[0] for o in debiasing_orders(TEAM)} == {0, 1, 2, 3}


def test_a_pure_position_preference_is_removed_and_estimated() -> None:
    """Scores that are content x position: averaging over the shifts leaves the content, and the
    prior PriDe estimates is the position part."""
    content, position = [0.5, 0.3, 0.2], [0.6, 0.3, 0.1]
    orders = [(2, 0, 1), (0, 1, 2), (1, 2, 0)]
    per_order = []
    for order in orders:
        raw = [content[order[i]] * position[i] for i in range(3)]
        per_order.append([p / sum(raw) for p in raw])
    logs = averaged_over_orders(per_order, orders)
    weights = [math.exp(x) for x in logs]
    assert close([w / sum(weights) for w in weights], content, F64_ARITHMETIC)
    assert close(position_prior(per_order), position, F64_ARITHMETIC)


# -- on SmolLM2 -----------------------------------------------------------------------------------


def test_nothing_asked_is_the_plain_answer(engine) -> None:
    questions = [TEAM, predicate_view("Was the parcel late?")]
    plain = decide(engine, questions)
    none = decide(engine, questions, [Adjustment(), Adjustment()])
    assert none == plain and none.applied == ()  # the same object values, nothing applied


def test_permute_is_invariant_to_reordering(engine) -> None:
    found = []
    for order in [(0, 1, 2, 3), (1, 2, 3, 0), (3, 1, 0, 2), (2, 3, 1, 0)]:
        view = arranged(TEAM, order)
        result = decide(engine, [view], [Adjustment("permute")])
        [answer], [applied] = result.answers, result.applied
        assert applied.debias == "permute" and applied.orders == 4
        by_name = dict(zip(view.option_names, answer.probabilities, strict=True))
        found.append([by_name[name] for name in TEAM.option_names])
    for other in found[1:]:
        assert close(found[0], other), (found[0], other)
    plain = decide(engine, [TEAM]).answers[0]
    permuted = decide(engine, [TEAM], [Adjustment("permute")])
    assert close(permuted.applied[0].raw, plain.probabilities)
    assert permuted.answers[0].mass == pytest.approx(plain.mass, rel=MASS_RTOL)  # the plain reading's label mass


def test_permute_applies_to_choice_questions_only(engine) -> None:
    score = decision_score_view("How bad was it?", [("mild", None), ("bad", None), ("awful", None)])
    yes_no = predicate_view("Was the parcel late?")
    plain = decide(engine, [score, yes_no])
    result = decide(engine, [score, yes_no], [Adjustment("permute"), Adjustment("prior")])
    for before, after, applied in zip(plain.answers, result.answers, result.applied, strict=True):
        assert applied.debias == "none" and applied.orders == 1
        assert close(after.probabilities, before.probabilities)


def test_prior_is_estimated_then_applied_in_one_pass(engine) -> None:
    views = [decision_choice_view(f"Which word is closest to item {i}?", [("apple", None), ("river", None),
                                                                          ("stone", None)])
             for i in range(PRIOR_SAMPLE + 2)]
    estimating = decide(engine, views[:PRIOR_SAMPLE], [Adjustment("prior")] * PRIOR_SAMPLE)
    assert [a.prior_source for a in estimating.applied] == ["estimating"] * PRIOR_SAMPLE
    assert [a.debias for a in estimating.applied] == ["permute"] * PRIOR_SAMPLE
    assert [a.prior_questions for a in estimating.applied] == list(range(1, PRIOR_SAMPLE + 1))
    result = decide(engine, views[PRIOR_SAMPLE:], [Adjustment("prior")] * 2)
    applied = result.applied[0]
    assert applied.debias == "prior" and applied.orders == 1 and applied.prior_source == "estimated"
    # The prior: a mean of priors normalised in float64.
    assert applied.prior_questions == PRIOR_SAMPLE and sum(applied.prior) == pytest.approx(1, abs=F64_ARITHMETIC)
    # One pass with log p - log prior, renormalised (both sides in float64).
    weights = [p / q for p, q in zip(applied.raw, applied.prior, strict=True)]
    assert close(result.answers[0].probabilities, [w / sum(weights) for w in weights], F64_ARITHMETIC)
    # Other option counts estimate their own prior.
    four = decide(engine, [TEAM], [Adjustment("prior")]).applied[0]
    assert four.prior_source == "estimating" and four.debias == "permute"


def test_contextual_divides_out_the_content_free_answer_once(engine) -> None:
    yes_no = predicate_view("Is the customer happy?")
    first = decide(engine, [yes_no, TEAM], [Adjustment(calibration="contextual")] * 2)
    content_free = decide(engine, [yes_no, TEAM], text="N/A")
    for answer, applied, cf in zip(first.answers, first.applied, content_free.answers, strict=True):
        assert applied.calibration == "contextual" and applied.debias == "none"
        assert close(applied.content_free, cf.probabilities)
        weights = [p / q for p, q in zip(applied.raw, applied.content_free, strict=True)]
        assert close(answer.probabilities, [w / sum(weights) for w in weights], F64_ARITHMETIC)  # float64 both
    again = decide(engine, [yes_no, TEAM], [Adjustment(calibration="contextual")] * 2)
    assert again.input_tokens < first.input_tokens  # the content-free answers were remembered
    assert again.answers == first.answers
    plain = decide(engine, [yes_no, TEAM])
    assert again.input_tokens == plain.input_tokens


def test_fitted_applies_the_stored_temperature(engine, store: Path) -> None:
    yes_no = predicate_view("Was the parcel late?")
    with pytest.raises(DecisionError) as refused:
        decide(engine, [yes_no], [Adjustment(calibration="fitted")])
    assert refused.value.status == 400 and "swama calibrate" in str(refused.value)
    folder = engine.model(SMOLLM2_ID).path
    write_calibration(folder, CalibrationFile(temperatures={"none": {"yes_no": 2.0, "choice": 0.5, "choice/4": 3.0},
                                                            "permute": {"choice": 1.5}},
                                              priors={4: Prior((0.4, 0.3, 0.2, 0.1), 99)}))
    try:
        result = decide(engine, [yes_no, TEAM, shifted(TEAM, 1)],
                        [Adjustment(calibration="fitted"), Adjustment(calibration="fitted"),
                         Adjustment("permute", "fitted")])
        assert [a.temperature for a in result.applied] == [2.0, 3.0, 1.5]  # per option count wins over kind
        for answer, applied in zip(result.answers[:2], result.applied[:2], strict=True):
            weights = [p ** (1 / applied.temperature) for p in applied.raw]
            assert close(answer.probabilities, [w / sum(weights) for w in weights], F64_ARITHMETIC)  # float64 both
        prior = decide(engine, [TEAM], [Adjustment("prior")]).applied[0]
        assert prior.prior_source == "file" and prior.prior == (0.4, 0.3, 0.2, 0.1) and prior.prior_questions == 99
    finally:
        (folder / "swama-calibration.json").unlink()
    with pytest.raises(DecisionError):  # the file is read again when it changes
        decide(engine, [yes_no], [Adjustment(calibration="fitted")])
