"""The debiasing benchmark's pure parts: the question sets built by construction
(tools/bench/decision_sets.py) and the order-consistency metrics (tools/bench/debias.py). No model."""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter

import pytest
from precision import F64_ARITHMETIC

from swama.engine.client import check_choice_option_names, decision_choice_view, predicate_view
from swama.generated.decisions_models import (
    DecisionChoiceQuestion,
    DecisionPredicateQuestion,
    DecisionQuestion,
)
from tools.bench import debias
from tools.bench.decision_sets import (
    CATEGORIES,
    CITIES,
    NEGATIVE_WORDS,
    POSITIVE_WORDS,
    labelled_set,
    order_set,
    order_set_answers,
    question_view,
    write_jsonl,
)

# The question sets ------------------------------------------------------------------------------


def test_order_set_is_deterministic_by_seed():
    assert order_set(48, 0) == order_set(48, 0)
    assert order_set(48, 0) != order_set(48, 1)


def test_order_set_holds_choice_questions_of_three_to_five_distinct_options():
    items = order_set(48, 0)
    assert len(items) == 48
    assert Counter(view.option_count for _, view in items) == {3: 16, 4: 16, 5: 16}
    for text, view in items:
        assert text.strip() and view.kind == "choice" and view.question.strip()
        check_choice_option_names(view.option_names, 255)
    described = [view for _, view in items if any(view.option_details)]
    assert 0 < len(described) < len(items)  # options with and without descriptions
    assert len({view.question for _, view in items}) >= 7  # the families


def test_order_set_answers_are_among_the_options_and_right():
    items, answers = order_set(48, 2), order_set_answers(48, 2)
    assert len(answers) == 48
    for (text, view), right in zip(items, answers, strict=True):
        assert right in view.option_names
        if view.question.startswith("Which count is the"):
            counts = [int(n) for n in re.findall(r"\d+", text.split(":", 1)[1])]
            assert int(right) == (max(counts) if "largest" in view.question else min(counts))


def test_order_set_can_hold_one_option_count():
    assert {view.option_count for _, view in order_set(20, 3, (4,))} == {4}


def test_labelled_set_is_deterministic_and_mixes_predicates_and_choices():
    records = labelled_set(200, 0)
    assert records == labelled_set(200, 0) and records != labelled_set(200, 1)
    types = Counter(r["question"]["type"] for r in records)
    assert types == {"predicate": 100, "choice": 100}
    truths = Counter(r["answer"] for r in records if r["question"]["type"] == "predicate")
    assert 30 <= truths[True] <= 70  # both answers, neither rare
    counts = Counter(len(r["question"]["choices"]) for r in records if r["question"]["type"] == "choice")
    assert set(counts) == {3, 4}


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def _gold(record: dict) -> bool | str:
    """The right answer worked out again from the text, family by family."""
    text, question = record["input"], record["question"]
    asked = question["instructions"]
    if m := re.fullmatch(r"In the shop, (.+) costs (\d+) dollars and (.+) costs (\d+) dollars\.", text):
        prices = {m[1]: int(m[2]), m[3]: int(m[4])}
        if q := re.fullmatch(r"Does (.+) cost more than (.+)\?", asked):
            return prices[q[1]] > prices[q[2]]
        q = re.fullmatch(r"Is (.+) cheaper than (.+)\?", asked)
        return prices[q[1]] < prices[q[2]]
    if text.startswith("Shopping list: "):
        listed = text.removeprefix("Shopping list: ").removesuffix(".").split(", ")
        return re.fullmatch(r"Is (.+) on the shopping list\?", asked)[1] in listed
    if text.startswith("The word of the day is"):
        word = re.search(r'"(.+)"', text)[1]
        category = next(c for c, words in CATEGORIES.items() if word in words)
        if question["type"] == "choice":
            return category
        return category == re.fullmatch(r"Is the word of the day a kind of (.+)\?", asked)[1]
    if text.startswith("The numbers are"):
        return str(max(_numbers(text)))
    positive = any(w in text for w in POSITIVE_WORDS)
    if positive or any(w in text for w in NEGATIVE_WORDS):
        assert not (positive and any(w in text for w in NEGATIVE_WORDS))
        if question["type"] == "choice":
            return "positive" if positive else "negative"
        return positive if asked == "Is this review positive?" else not positive
    (city,) = [c for c in CITIES if c in text]
    return city


def test_labelled_answers_are_right_by_construction():
    for record in labelled_set(200, 3):
        assert record["answer"] == _gold(record), record


def test_labelled_questions_parse_as_decision_questions():
    for record in labelled_set(120, 0):
        question = DecisionQuestion.model_validate(record["question"]).root
        if record["question"]["type"] == "predicate":
            assert isinstance(question, DecisionPredicateQuestion) and isinstance(record["answer"], bool)
        else:
            assert isinstance(question, DecisionChoiceQuestion)
            values = [c.value.root for c in question.choices]
            assert record["answer"] in values and len(set(values)) == len(values)
            check_choice_option_names(values, 255)


def test_question_view_follows_the_question():
    assert question_view({"type": "predicate", "instructions": "Is it?"}) == predicate_view("Is it?")
    choice = {"type": "choice", "instructions": "Which?",
              "choices": [{"value": "a", "description": "the first"}, {"value": "b"}]}
    assert question_view(choice) == decision_choice_view("Which?", [("a", "the first"), ("b", None)])


def test_write_jsonl_round_trips_and_calibrate_reads_it(tmp_path):
    records = labelled_set(20, 0)
    path = write_jsonl(records, tmp_path / "data.jsonl")
    assert [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] == records
    from swama.handlers.cli.calibrate import read_records

    read = read_records(path)
    assert [r.view for r in read] == [question_view(r["question"]) for r in records]
    for r, record in zip(read, records, strict=True):  # gold: the index of the answer (yes first)
        expected = (0 if record["answer"] else 1) if isinstance(record["answer"], bool) else \
            [c["value"] for c in record["question"]["choices"]].index(record["answer"])
        assert r.gold == expected


# The metrics --------------------------------------------------------------------------------------


def test_option_orders_start_with_the_original_and_differ():
    rng = random.Random(0)
    orders = debias.option_orders(4, 4, rng)
    assert orders[0] == (0, 1, 2, 3) and len(set(orders)) == 4
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    assert sorted(debias.option_orders(2, 4, rng)) == [(0, 1), (1, 0)]  # only as many as there are


def test_reordered_moves_names_and_details_together():
    view = decision_choice_view("Which?", [("a", "first"), ("b", None), ("c", "third")])
    moved = debias.reordered(view, (2, 0, 1))
    assert moved.option_names == ("c", "a", "b") and moved.option_details == ("third", "first", "")
    assert debias.by_value(moved, (0.5, 0.3, 0.2)) == {"c": 0.5, "a": 0.3, "b": 0.2}


def test_total_variation_on_hand_cases():
    p = {"a": 0.5, "b": 0.5}
    assert debias.total_variation(p, p) == 0
    assert debias.total_variation({"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}) == 1
    assert debias.total_variation({"a": 0.6, "b": 0.4}, {"b": 0.6, "a": 0.4}) == pytest.approx(0.2, abs=F64_ARITHMETIC)
    answers = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 0.0}]
    assert debias.mean_pairwise_tv(answers) == pytest.approx(2 / 3, abs=F64_ARITHMETIC)  # pairs: 1, 0, 1
    assert debias.mean_pairwise_tv(answers[:1]) == 0


def test_same_top_compares_top_values():
    assert debias.same_top([{"a": 0.6, "b": 0.4}, {"b": 0.45, "a": 0.55}])
    assert not debias.same_top([{"a": 0.6, "b": 0.4}, {"b": 0.55, "a": 0.45}])
    assert debias.top_value({"a": 0.5, "b": 0.5}) == "a"


def test_consistency_counts_questions_and_positions():
    measured = debias.Consistency("none")
    view = decision_choice_view("Which?", [("a", None), ("b", None), ("c", None)])
    swapped = debias.reordered(view, (1, 0, 2))
    measured.add([view, swapped], [(0.7, 0.2, 0.1), (0.6, 0.3, 0.1)], "a")  # first position both times: a, then b
    measured.add([view, swapped], [(0.2, 0.7, 0.1), (0.7, 0.2, 0.1)])  # b both times, right value unknown
    assert measured.consistent() == (1, 2) and measured.consistent(3) == (1, 2) and measured.consistent(4) == (0, 0)
    assert measured.share == 0.5
    assert measured.first_position_share == 0.75
    assert measured.chance_first == pytest.approx(1 / 3, abs=F64_ARITHMETIC)
    assert measured.accuracy == 0.5 and measured.chance == pytest.approx(1 / 3, abs=F64_ARITHMETIC)  # the known question only
    first = 0.5 * (0.4 + 0.4 + 0)  # {a .7 b .2 c .1} against {a .3 b .6 c .1}
    assert measured.mean_tv == pytest.approx((first + 0) / 2, abs=F64_ARITHMETIC)
    assert not math.isnan(measured.mean_tv)


def test_cost_request_asks_about_one_shared_input():
    text, views = debias.cost_request(7, 20, 4)
    assert len(views) == 20 and {v.option_count for v in views} == {4}
    assert all(f"Text {i}:" in text and v.question.startswith(f"About text {i}:")
               for i, v in enumerate(views, start=1))


def test_a_temperature_at_the_bound_of_the_fit_is_explained():
    rows = {("none", "choice"): (0.2, 0.36, 0.86), ("none", "yes_no"): (0.7, 0.1, 0.4)}
    figures = debias.CalibrationFigures(30, 70, rows, {"choice": 20.0, "yes_no": 1.05}, 1.0,
                                        {"choice": 0.3, "yes_no": 0.5})
    note = debias.at_bound_note(figures)
    assert "choice temperature stopped at the upper bound" in note and "20%" in note and "30%" in note
    assert "yes_no" not in note
    assert debias.at_bound_note(debias.CalibrationFigures(30, 70, rows, {"choice": 3.0}, 1.0)) == ""


def test_the_report_states_each_target_and_the_command():
    view = decision_choice_view("Which?", [("a", None), ("b", None), ("c", None)])
    consistency = {}
    for method, second in (("none", (0.2, 0.7, 0.1)), ("permute", (0.7, 0.2, 0.1)), ("prior", (0.2, 0.7, 0.1))):
        measured = debias.Consistency(method)
        measured.add([view, view], [(0.7, 0.2, 0.1), second], "a")
        measured.prior_sources.update(["estimated"] * 2 if method == "prior" else [])
        consistency[method] = measured
    rows = {(c, k): (0.5, ece, 0.6) for c, ece in (("none", 0.2), ("fitted", 0.08), ("contextual", 0.15))
            for k in ("all", "yes_no", "choice")}
    figures = debias.CalibrationFigures(30, 70, rows, {"choice": 2.0, "yes_no": 1.5}, 1.0, {"choice": 0.3})
    times = {case: [1.0, 1.2, 1.1] for case in debias.COST_CASES} | {"permute": [3.0, 3.3, 2.9]}
    results = debias.Results("org/Model-1", 2, 48, Counter(), consistency, figures, times, 500, 3, 0.5, 600.0,
                             0.7, 4.8)
    p = debias.parser()
    args = p.parse_args(["--orders", "2", "--runs", "3"])
    text = debias.report(results, args, p.parse_args([]))
    assert "`python -m tools.bench.debias --model smollm2 --orders 2 --runs 3 --record`" in text
    assert "with `permute`: **met** (100%, against 0% without debiasing" in text
    assert "halves the ECE: **met** (0.200 to 0.080, 0.40x)." in text
    assert "at most 2x the latency of none: **not met** (2.75x, the median of the per-run ratios)" in text
    assert "right value in 50% of the answers without debiasing, 100% with `permute`" in text
    assert "nan" not in text
    assert "/work" not in text and "/tmp" not in text
