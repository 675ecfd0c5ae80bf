"""`swama calibrate`: labelled examples read with the route's rules (a bad line is refused with its
number), a real run on SmolLM2 that writes the model's calibration, prints the held-out table and
draws the reliability diagram, and the engine answering `fitted` with what it wrote."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import SMOLLM2_ID, make_store
from precision import F64_ARITHMETIC

from swama.engine.client import (
    PROMPT_FORMAT_VERSION,
    Adjustment,
    DecisionError,
    DecisionJob,
    DecisionResult,
    EngineClient,
    EngineSettings,
    apply_temperature,
    decision_choice_view,
    decision_score_view,
    open_engine,
    predicate_view,
    read,
    read_calibration,
)
from swama.handlers.cli.calibrate import Record, calibrate, read_records, split
from swama.handlers.cli.main import build_parser

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# How much worse the held-out ECE may get with the fitted temperature, on 20 examples (each weighs 0.05
# in it): a fit on the 30 others need not lower it. Measured 0.265 plain, 0.193 fitted.
ECE_TOLERANCE = 0.02

LARGEST = [[37, 12, 85, 4], [8, 91, 55, 54], [3, 30, 76, 19], [42, 88, 61, 16], [27, 72, 90, 9],
           [14, 41, 66, 23], [98, 5, 47, 70], [33, 11, 80, 58], [6, 60, 29, 92], [75, 57, 18, 81]]
COMPARED = [(37, 12), (8, 91), (55, 54), (3, 30), (76, 19), (42, 88), (61, 16), (27, 72), (14, 41), (98, 5),
            (47, 70), (33, 11), (80, 58), (6, 60)]
APPLES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 2, 5, 8, 3, 6]
DEGREES = [-5, 0, 4, 8, 12, 15, 19, 23, 27, 31, 36, 40]
APPLES_LEVELS = [{"label": "few (1-3)"}, {"label": "some (4-6)"}, {"label": "many (7-9)"}]
DEGREES_LEVELS = [{"label": "cold", "description": "below 10 degrees"},
                  {"label": "mild", "description": "10 to 25 degrees"},
                  {"label": "hot", "description": "above 25 degrees"}]


def predicate(instructions: str) -> dict[str, Any]:
    return {"type": "predicate", "instructions": instructions}


def choice(instructions: str, *values: Any) -> dict[str, Any]:
    return {"type": "choice", "instructions": instructions, "choices": [{"value": v} for v in values]}


def score(instructions: str, levels: list[dict[str, str]]) -> dict[str, Any]:
    return {"type": "score", "instructions": instructions, "levels": levels}


def largest_examples() -> list[dict[str, Any]]:
    return [{"input": f"The numbers are {', '.join(map(str, numbers))}.",
             "question": choice("Which number is the largest?", *map(str, numbers)), "answer": str(max(numbers))}
            for numbers in LARGEST]


def examples() -> list[dict[str, Any]]:
    """50 examples, right by construction, on which SmolLM2 is sure of itself and often wrong (mostly
    its scores), so a fitted temperature helps on held-out examples: counts and temperatures as
    levels (the answer as the level's index, then as its label), comparisons, the largest number."""
    found = [{"input": " ".join(["apple"] * n), "question": score("How many apples are there?", APPLES_LEVELS),
              "answer": (n - 1) // 3} for n in APPLES]
    found += [{"input": f"It is {t} degrees Celsius outside.", "question": score("How hot is it?", DEGREES_LEVELS),
               "answer": "cold" if t < 10 else "mild" if t <= 25 else "hot"} for t in DEGREES]
    found += [{"input": f"Compare the numbers {a} and {b}.", "question": predicate(f"Is {a} greater than {b}?"),
               "answer": a > b} for a, b in COMPARED]
    return found + largest_examples()


def write_lines(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def run_command(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


# Reading the examples ---------------------------------------------------------------------------


def test_examples_of_every_kind_are_read_with_their_right_option(tmp_path: Path) -> None:
    score = {"type": "score", "instructions": "How urgent is it?",
             "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high", "description": "today"}]}
    data = write_lines(tmp_path / "data.jsonl", [
        {"input": "a", "question": predicate("Is it about billing?"), "answer": True},
        "",
        {"input": "b", "question": predicate("Is it about billing?"), "answer": False, "id": 7},
        {"input": "c", "question": choice("Which team?", "billing", True, "sales"), "answer": True},
        {"input": "d", "question": choice("Which team?", "billing", "true"), "answer": "true"},
        {"input": "e", "question": score, "answer": "high"},
        {"input": "f", "question": score, "answer": 1},
    ])
    records = read_records(data)
    assert [(r.input, r.view.kind, r.gold, r.line) for r in records] == [
        ("a", "yes_no", 0, 1), ("b", "yes_no", 1, 3), ("c", "choice", 1, 4), ("d", "choice", 1, 5),
        ("e", "score", 2, 6), ("f", "score", 1, 7)]
    assert records[2].view == decision_choice_view("Which team?", [("billing", None), (True, None), ("sales", None)])
    assert records[0].view == predicate_view("Is it about billing?")


@pytest.mark.parametrize(("bad", "says"), [
    ("{not json", "not valid JSON"),
    ('["input", "question", "answer"]', "JSON object"),
    ({"input": "x", "question": predicate("Is it?")}, "'answer'"),
    ({"input": 3, "question": predicate("Is it?"), "answer": True}, "input must be a string"),
    ({"input": "x", "question": predicate("Is it?"), "answer": "yes"}, "true or false"),
    ({"input": "x", "question": choice("Which?", "a", "b"), "answer": "c"}, 'not one of the choice values "a", "b"'),
    ({"input": "x", "question": choice("Which?", "a"), "answer": "a"}, "the question choices must contain 2–255"),
    ({"input": "x", "question": choice("Which?", "a", "a"), "answer": "a"}, "the question has the duplicate choice value"),
    ({"input": "x", "question": choice("Which?", "a", "A"), "answer": "a"}, "distinct, valid options"),
    ({"input": "x", "question": {"type": "yes_no", "instructions": "Is it?"}, "answer": True},
     "type must be predicate, choice, or score"),
    ({"input": "x", "question": {"type": "predicate", "instructions": " "}, "answer": True},
     "instructions must be a non-empty string"),
    ({"input": "x", "question": {"type": "predicate", "instructions": "Is it?", "weight": 2}, "answer": True},
     "Unknown decision field 'weight'"),
    ({"input": "x", "question": {"type": "score", "instructions": "How much?", "levels": [{"label": "low"},
                                                                                          {"label": "high"}]},
      "answer": 2}, "0 to 1"),
])
def test_a_bad_line_is_refused_with_its_number_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         bad: Any, says: str) -> None:
    good = {"input": "x", "question": predicate("Is it?"), "answer": True}
    data = write_lines(tmp_path / "data.jsonl", [good, good, bad, good])
    assert run_command(["calibrate", "smollm2", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: data.jsonl line 3: ") and says in err, err


def test_an_empty_file_a_missing_one_and_a_bad_holdout_exit_2(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(["calibrate", "smollm2", str(write_lines(tmp_path / "empty.jsonl", ["", " "]))]) == 2
    assert "holds no examples" in capsys.readouterr().err
    assert run_command(["calibrate", "smollm2", str(tmp_path / "nowhere.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert run_command(["calibrate", "smollm2", str(tmp_path / "nowhere.jsonl"), "--holdout", "1"]) == 2
    assert "--holdout" in capsys.readouterr().err
    assert run_command(["calibrate", "smollm2", str(tmp_path / "nowhere.jsonl"), "--default-debias", "permute"]) == 2
    assert "--default-debias permute is not among the methods calibrated" in capsys.readouterr().err


def test_the_split_is_seeded_stratified_and_leaves_every_kind_something_to_fit() -> None:
    view = predicate_view("Is it?")
    three = decision_choice_view("Which?", [("a", None), ("b", None), ("c", None)])
    records = [Record(str(i), view if i % 3 else three, 0, i + 1) for i in range(30)] + [Record("x", view, 0, 99)]
    fit, held = split(records, 0.3, seed=4)
    assert split(records, 0.3, seed=4) == (fit, held) and split(records, 0.3, seed=5) != (fit, held)
    assert sorted(r.line for r in fit + held) == sorted(r.line for r in records)
    assert sum(r.view.kind == "choice" for r in held) == 3 and sum(r.view.kind == "yes_no" for r in held) == 6
    assert [r.line for r in held] == sorted(r.line for r in held)  # the file's order
    lone = [Record("a", view, 0, 1), Record("b", three, 0, 2)]
    assert split(lone, 0.5, seed=0) == (lone, [])  # one example of a kind is always fitted
    with pytest.raises(ValueError):
        split(records, 1.0, seed=0)


# A real run on SmolLM2 ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calibrate_store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A store of its own: the run writes into the model's folder."""
    return make_store(tmp_path_factory, "calibrate-store", {SMOLLM2_ID: smollm2_dir})


async def decided(engine: EngineClient, job: DecisionJob) -> DecisionResult:
    async for result in engine.decide("smollm2", job):
        return result
    raise AssertionError("no result")


FITTED = Adjustment(calibration="fitted")


def fitted_job(*views: Any, adjustment: Adjustment = FITTED) -> DecisionJob:
    return DecisionJob("Compare the numbers 12 and 7; the numbers are 12, 7, 30 and 2.", list(views),
                       context_limit=4096, adjustments=[adjustment] * len(views))


@pytest.mark.slow
def test_calibrate_on_smollm2_writes_what_the_engine_then_applies(
        calibrate_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAMA_MODELS", str(calibrate_store))
    data = write_lines(tmp_path / "labelled.jsonl", examples())
    views = {"yes_no": predicate_view("Is 12 greater than 7?"),
             "choice": decision_choice_view("Which number is the largest?", [(n, None) for n in ("12", "7", "30", "2")]),
             "score": decision_score_view("How many numbers are there?", [("one", None), ("two", None), ("four", None)])}

    async def scenario() -> None:
        engine = open_engine(read(EngineSettings))
        try:
            # Before any calibration, fitted is refused before anything is scored.
            with pytest.raises(DecisionError) as refused:
                await decided(engine, fitted_job(views["yes_no"]))
            assert refused.value.status == 400 and "swama calibrate smollm2" in refused.value.message

            done = subprocess.run([sys.executable, "-m", "swama.handlers.cli", "calibrate", "smollm2", str(data),
                                   "--holdout", "0.4"], cwd=tmp_path, capture_output=True, text=True,
                                  env={**os.environ, "SWAMA_MODELS": str(calibrate_store)}, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
            out = done.stdout
            for text in ("50 examples: 30 to fit, 20 held out", "plain (before)", "fitted", "contextual",
                         "accuracy", "ECE", "Brier", "yes_no", "choice", "score", "swama-calibration.json"):
                assert text in out, out
            png = tmp_path / "smollm2-reliability.png"
            assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 10_000

            model = engine.model("smollm2")
            calibration = read_calibration(model.path)
            assert calibration.prompt_format == PROMPT_FORMAT_VERSION
            temperatures = calibration.temperatures["none"]
            assert set(temperatures) == {"yes_no", "choice", "score"}
            assert all(0.05 <= t <= 20 for t in temperatures.values())  # the fit's bounds
            held = calibration.report["held_out"]["none"]
            assert held["none"]["all"]["n"] == held["fitted"]["all"]["n"] == 20
            assert held["fitted"]["all"]["ece"] <= held["none"]["all"]["ece"] + ECE_TOLERANCE, held
            assert held["fitted"]["all"]["accuracy"] == held["none"]["all"]["accuracy"]  # one T keeps the argmax

            # The engine now answers fitted with the stored temperatures, on the answers' logs.
            result = await decided(engine, fitted_job(*views.values()))
            for answer, applied, kind in zip(result.answers, result.applied, views, strict=True):
                assert applied is not None and applied.calibration == "fitted"
                assert applied.temperature == temperatures[kind]
                # softmax(log p / T) in float64 both, in another order: T >= 0.05 magnifies the logs'
                # rounding at most 20-fold, still far under F64_ARITHMETIC.
                assert answer.probabilities == pytest.approx(apply_temperature(applied.raw, temperatures[kind]),
                                                             abs=F64_ARITHMETIC)

            # A second method keeps the first one's temperatures; prior writes its positional prior.
            choices = read_records(write_lines(tmp_path / "choices.jsonl", largest_examples()))
            assert calibration.defaults == {}  # the first run named no default
            report = await calibrate(engine, model.id, choices, holdout=0.25, seed=0, debias=("prior",),
                                     default_debias="prior")
            again = read_calibration(model.path)
            assert again.defaults == {"debias": "prior", "calibration": "fitted"}
            assert again.temperatures["none"] == temperatures
            assert set(again.temperatures["prior"]) == {"choice"} == set(report.temperatures["prior"])
            prior = again.priors[4]
            # A mean of priors normalised in float64; JSON keeps the floats exactly.
            assert prior == report.priors[4] and prior.questions == 8
            assert sum(prior.probabilities) == pytest.approx(1, abs=F64_ARITHMETIC)
            assert "none" in again.report["held_out"] and "prior" in again.report["held_out"]
            labels = [m.label for m in report.measures if m.kind == "all"]
            assert labels == ["plain (before)", "prior", "prior + fitted", "prior + contextual"]
            result = await decided(engine, fitted_job(views["choice"], adjustment=Adjustment("prior", "fitted")))
            applied = result.applied[0]
            assert applied is not None and applied.prior_source == "file" and applied.prior == prior.probabilities
            assert applied.temperature == again.temperatures["prior"]["choice"]
        finally:
            await engine.close()

    asyncio.run(scenario())
