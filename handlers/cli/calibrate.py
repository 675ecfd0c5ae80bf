"""`swama calibrate`: fit a model's decision calibration on labelled examples, and measure it.

The examples are split into a fit set and a held-out set (seeded, stratified by question kind).
For each debiasing method asked for, every example is answered through the engine as a request
with `x_debias` would be, a temperature is fitted per question kind (and per option count with
`--per-option-count`) on the fit set, and for `prior` the positional priors are estimated from the
fit set's choice questions under every cyclic order of their options. The held-out set measures
accuracy, expected calibration error and the Brier score before calibration, with the fitted
temperature, and with `contextual` calibration. The result goes into the model's folder
(`swama-calibration.json`, which the server reads for `x_calibration: "fitted"` and `x_debias:
"prior"`), a table to stdout, and a reliability diagram to a PNG.

`read_records` and `calibrate` are importable (a benchmark uses them); the command runs the engine
in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pydantic

from swama.engine.client import (
    DEBIAS_METHODS,
    PROMPT_FORMAT_VERSION,
    Adjustment,
    Applied,
    CalibrationFile,
    DecisionError,
    DecisionJob,
    DecisionResult,
    EngineClient,
    EngineError,
    EngineSettings,
    Prior,
    QuestionView,
    RuntimeSettings,
    ScoredAnswer,
    Task,
    accuracy,
    apply_temperature,
    brier_score,
    expected_calibration_error,
    fit_temperature,
    floored_logs,
    model_files,
    open_engine,
    order_shifts,
    position_prior,
    read,
    read_calibration,
    reliability_bins,
    shifted,
    write_calibration,
)
from swama.generated.decisions_models import (
    DecisionChoiceQuestion,
    DecisionCreateRequest,
    DecisionScoreQuestion,
)
from swama.handlers.cli.options import add_options, given
from swama.handlers.http.errors import ApiError
from swama.handlers.routes.decisions import check_questions, question_view
from swama.handlers.routes.decisions_wording import schema_error

KINDS = ("yes_no", "choice", "score")  # the order of the table
KIND_OF_TYPE = {"predicate": "yes_no", "choice": "choice", "score": "score"}
MIN_FIT = 5  # fit-set examples a kind needs for a temperature of its own
MIN_FIT_PER_COUNT = 8  # ... and one option count of a kind, with --per-option-count
QUESTIONS_PER_JOB = 64  # questions about one input scored in one engine job
DEFAULT_CONTEXT_LIMIT: int = EngineSettings.model_fields["context_limit"].default
CALIBRATIONS = ("none", "fitted", "contextual")

EXAMPLE = ('{"input": "Order 1234 arrived broken.", "question": {"type": "choice", "instructions": '
           '"Which team should handle this?", "choices": [{"value": "billing"}, {"value": "shipping"}, '
           '{"value": "sales"}]}, "answer": "shipping"}')


# The examples -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One labelled example: the input, the question as the engine sees it, and the index of the
    right option in request order (yes/no: 0 for yes, 1 for no; score: the level's index)."""

    input: str
    view: QuestionView
    gold: int
    line: int = 0  # where it was in the file (1 for the first line)


class DataError(ValueError):
    """A line of the examples file that cannot be used; the message names the file and the line."""


def _worded(message: str) -> str:
    """A refusal of /v1/decisions about its one question, said of the line's question."""
    return message.replace("questions[0]", "the question")


def _gold(question: Any, answer: Any) -> int:
    """The index of `answer` among the question's options; ValueError saying what was expected."""
    if isinstance(question, DecisionChoiceQuestion):
        values = [c.value.root for c in question.choices]
        for i, value in enumerate(values):
            if type(value) is type(answer) and value == answer:
                return i
        raise ValueError(f"answer {json.dumps(answer, ensure_ascii=False)} is not one of the choice values "
                         f"{', '.join(json.dumps(v, ensure_ascii=False) for v in values)}")
    if isinstance(question, DecisionScoreQuestion):
        labels = [level.label for level in question.levels]
        if isinstance(answer, int) and not isinstance(answer, bool):
            if 0 <= answer < len(labels):
                return answer
            raise ValueError(f"answer {answer} is not a level index: a score question with {len(labels)} levels "
                             f"takes 0 to {len(labels) - 1}, or a level's label")
        if isinstance(answer, str) and labels.count(answer) == 1:
            return labels.index(answer)
        if isinstance(answer, str) and answer in labels:
            raise ValueError(f"answer {json.dumps(answer)} names several levels; give the level's index instead")
        raise ValueError(f"answer {json.dumps(answer, ensure_ascii=False)} is neither a level index (0 to "
                         f"{len(labels) - 1}) nor one of the labels "
                         f"{', '.join(json.dumps(label, ensure_ascii=False) for label in labels)}")
    if isinstance(answer, bool):
        return 0 if answer else 1
    raise ValueError(f"a predicate's answer is true or false, not {json.dumps(answer, ensure_ascii=False)}")


def parse_record(data: Any) -> Record:
    """One example from its JSON value; ValueError saying what is wrong with it."""
    if not isinstance(data, dict):
        raise ValueError('each line must be a JSON object with "input", "question" and "answer"')
    missing = [key for key in ("input", "question", "answer") if key not in data]
    if missing:
        raise ValueError(f"missing {', '.join(repr(k) for k in missing)} (each line needs input, question "
                         "and answer)")
    if not isinstance(data["input"], str):
        raise ValueError("input must be a string")
    # Checked as the route checks a request with this one question, in the route's words.
    request = {"model": "calibrate", "input": data["input"], "questions": [data["question"]]}
    try:
        question = DecisionCreateRequest.model_validate(request).questions[0].root
        check_questions([question])
    except pydantic.ValidationError as exc:
        raise ValueError(_worded(schema_error(exc, request).message)) from None
    except ApiError as exc:
        raise ValueError(_worded(exc.message)) from None
    except DecisionError as exc:
        raise ValueError(_worded(exc.message)) from None
    return Record(data["input"], question_view(question), _gold(question, data["answer"]))


def read_records(path: str | Path) -> list[Record]:
    """The labelled examples of a JSON Lines file, one per non-blank line; DataError naming the
    line of the first one that cannot be used."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text") from None
    records: list[Record] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path.name} line {number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        try:
            records.append(replace(parse_record(data), line=number))
        except ValueError as exc:
            raise DataError(f"{path.name} line {number}: {exc}") from None
    if not records:
        raise DataError(f"{path.name} holds no examples")
    return records


# Scoring through the engine -----------------------------------------------------------------


class ScoringError(Exception):
    """The engine refused the questions of some lines (a context too long, say): the message names
    the lines."""

    def __init__(self, lines: Sequence[int], cause: EngineError) -> None:
        numbers = sorted(set(lines))
        where = f"line {numbers[0]}" if len(numbers) == 1 else \
            "lines " + ", ".join(map(str, numbers[:10])) + (" ..." if len(numbers) > 10 else "")
        self.message = f"{where}: {cause.message}"
        super().__init__(self.message)


Scored = tuple[ScoredAnswer, Applied | None]


class _Bar:
    """A progress bar on stderr (shown on a terminal only)."""

    def __init__(self, show: bool) -> None:
        self.show = show

    def __call__(self, total: int, desc: str) -> Any:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="q", file=sys.stderr, leave=False,
                    disable=None if self.show else True)


async def _decided(engine: EngineClient, model_id: str, job: DecisionJob) -> DecisionResult:
    async for result in engine.decide(model_id, job):
        return result
    raise EngineError("the engine gave no answer")


async def answer_all(engine: EngineClient, model_id: str, items: Sequence[tuple[Record, Adjustment]], *,
                     context_limit: int = DEFAULT_CONTEXT_LIMIT, bar: Any = None) -> list[Scored]:
    """Each (example, adjustment) answered by the engine, in order: the questions about one input
    go in one job (up to QUESTIONS_PER_JOB), so they share its prefill."""
    by_input: dict[str, list[int]] = {}
    for i, (record, _) in enumerate(items):
        by_input.setdefault(record.input, []).append(i)
    found: list[Scored | None] = [None] * len(items)
    for text, indices in by_input.items():
        for start in range(0, len(indices), QUESTIONS_PER_JOB):
            chunk = indices[start:start + QUESTIONS_PER_JOB]
            job = DecisionJob(text, [items[i][0].view for i in chunk], context_limit=context_limit,
                              adjustments=[items[i][1] for i in chunk])
            try:
                result = await _decided(engine, model_id, job)
            except EngineError as exc:
                if exc.status >= 500:
                    raise
                raise ScoringError([items[i][0].line for i in chunk], exc) from exc
            applied = list(result.applied) or [None] * len(chunk)
            for i, answer, done in zip(chunk, result.answers, applied, strict=True):
                found[i] = (answer, done)
            if bar is not None:
                bar.update(len(chunk))
    return found  # type: ignore[return-value]


# Fitting and measuring ----------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    """One held-out measurement: a debiasing method with a calibration, over one question kind
    (or "all")."""

    debias: str
    calibration: str  # "none" (the method alone), "fitted" or "contextual"
    kind: str
    n: int
    accuracy: float
    ece: float
    brier: float

    @property
    def label(self) -> str:
        return method_label(self.debias, self.calibration)


def method_label(debias: str, calibration: str) -> str:
    """How the table and the plot name a debiasing method with a calibration."""
    if debias == "none":
        return {"none": "plain (before)", "fitted": "fitted", "contextual": "contextual"}[calibration]
    return debias if calibration == "none" else f"{debias} + {calibration}"


@dataclass
class CalibrationReport:
    model_id: str
    path: Path  # the calibration file written
    records: int
    fit: int
    held_out: int
    seed: int
    temperatures: dict[str, dict[str, float]]  # what this run fitted: debias -> kind or "kind/n" -> T
    priors: dict[int, Prior]  # what this run estimated: option count -> prior
    measures: list[Measure]  # held out, in table order
    # Held-out probabilities per (debias, calibration), with the gold indices: for the plots.
    answers: dict[tuple[str, str], list[tuple[float, ...]]] = field(default_factory=dict)
    gold: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # the held-out examples' kinds
    notes: list[str] = field(default_factory=list)


def _stratum(record: Record, per_option_count: bool) -> str:
    kind = record.view.kind
    return f"{kind}/{record.view.option_count}" if per_option_count else kind


def split(records: Sequence[Record], holdout: float, seed: int, *,
          per_option_count: bool = False) -> tuple[list[Record], list[Record]]:
    """(fit, held out): a seeded shuffle within each question kind (and option count), `holdout` of
    each held out (rounded), always leaving one to fit. Both keep the file's order."""
    if not 0 <= holdout < 1:
        raise ValueError(f"the held-out share must be at least 0 and below 1, not {holdout}")
    strata: dict[str, list[Record]] = {}
    for record in records:
        strata.setdefault(_stratum(record, per_option_count), []).append(record)
    rng = random.Random(seed)
    fit: list[Record] = []
    held: list[Record] = []
    for key in sorted(strata):
        group = list(strata[key])
        rng.shuffle(group)
        k = min(round(len(group) * holdout), len(group) - 1)
        held += group[:k]
        fit += group[k:]
    return sorted(fit, key=lambda r: r.line), sorted(held, key=lambda r: r.line)




def fit_temperatures(records: Sequence[Record], probabilities: Sequence[Sequence[float]], *,
                     per_option_count: bool = False, notes: list[str] | None = None) -> dict[str, float]:
    """Temperatures per question kind (and "kind/n" per option count) from answered examples."""
    groups: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        groups.setdefault(record.view.kind, []).append(i)
        if per_option_count and record.view.kind != "yes_no":
            groups.setdefault(f"{record.view.kind}/{record.view.option_count}", []).append(i)
    fitted: dict[str, float] = {}
    for key in sorted(groups, key=lambda k: (KINDS.index(k.split("/")[0]), int(k.split("/")[1]) if "/" in k else 0)):
        indices = groups[key]
        least = MIN_FIT_PER_COUNT if "/" in key else MIN_FIT
        if len(indices) < least:
            if notes is not None and "/" not in key:
                notes.append(f"{key}: {len(indices)} examples to fit, fewer than {least}: no temperature")
            continue
        fitted[key] = round(fit_temperature([floored_logs(probabilities[i]) for i in indices],
                                            [records[i].gold for i in indices]), 6)
    return fitted


def estimate_priors(records: Sequence[Record], per_shift: Sequence[Sequence[Sequence[float]]]) -> dict[int, Prior]:
    """Positional priors per option count: the mean of each question's prior (`position_prior`) over
    its answers under every cyclic shift (`per_shift[i][s]`, shift s of record i)."""
    sums: dict[int, list[float]] = {}
    counts: dict[int, int] = {}
    for record, answers in zip(records, per_shift, strict=True):
        n = record.view.option_count
        prior = position_prior(answers)
        sums[n] = [a + b for a, b in zip(sums.get(n, [0.0] * n), prior, strict=True)]
        counts[n] = counts.get(n, 0) + 1
    return {n: Prior(tuple(round(s / counts[n], 8) for s in sums[n]), counts[n]) for n in sorted(sums)}


def _measure(debias: str, calibration: str, kind: str, rows: Sequence[Sequence[float]],
             gold: Sequence[int]) -> Measure:
    return Measure(debias, calibration, kind, len(gold), accuracy(rows, gold),
                   expected_calibration_error(rows, gold), brier_score(rows, gold))


def measures_of(answers: dict[tuple[str, str], list[tuple[float, ...]]], gold: Sequence[int],
                kinds: Sequence[str]) -> list[Measure]:
    """Every method's measure over all held-out examples, then per kind present."""
    found: list[Measure] = []
    present = [k for k in KINDS if k in kinds]
    for kind in ["all", *present]:
        chosen = [i for i, k in enumerate(kinds) if kind in ("all", k)]
        if not chosen:
            continue
        for (debias, calibration), rows in answers.items():
            found.append(_measure(debias, calibration, kind, [rows[i] for i in chosen], [gold[i] for i in chosen]))
    return found


def _merged(base: CalibrationFile, temperatures: dict[str, dict[str, float]], priors: dict[int, Prior],
            report: dict[str, Any]) -> CalibrationFile:
    """`base` with this run's methods replaced and everything else kept."""
    merged = CalibrationFile(PROMPT_FORMAT_VERSION, {**base.temperatures, **temperatures},
                             {**base.priors, **priors}, dict(base.report), dict(base.defaults))
    if report:
        methods = {**merged.report.get("held_out", {}), **report.pop("held_out", {})}
        merged.report.update(report)
        merged.report["held_out"] = methods
    return merged


def _report_json(measures: Sequence[Measure], methods: Sequence[str]) -> dict[str, Any]:
    """Per debiasing method: per calibration ("none": the method alone), per kind, the measures; a
    method other than none also gets the plain answers' as "plain", to compare with."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for m in measures:
        rows.setdefault((m.debias, m.calibration), {})[m.kind] = {
            "n": m.n, "accuracy": round(m.accuracy, 6), "ece": round(m.ece, 6), "brier": round(m.brier, 6)}
    held: dict[str, Any] = {}
    for method in methods:
        found = {} if method == "none" else {"plain": rows.get(("none", "none"), {})}
        held[method] = {**found, **{c: rows.get((method, c), {}) for c in CALIBRATIONS}}
    return held


async def calibrate(engine: EngineClient, model_id: str, records: Sequence[Record], *, holdout: float = 0.3,
                    seed: int = 0, debias: Sequence[str] = ("none",), per_option_count: bool = False,
                    context_limit: int = DEFAULT_CONTEXT_LIMIT, progress: bool = False,
                    default_debias: str | None = None) -> CalibrationReport:
    """Fit and measure the decision calibration of `model_id` on `records`, and write it into the
    model's folder (keeping what the file holds for other methods and option counts).

    Per debiasing method in `debias`: a temperature per question kind (and per "kind/n" with
    `per_option_count`) fitted on the fit set; for "prior", positional priors per option count first
    (from the fit set's choice questions under every cyclic shift), written before the examples are
    answered with them. The held-out set is measured plain, with each method, with its fitted
    temperature and with contextual calibration. `default_debias` (one of `debias`): questions on
    this model that name no debiasing or calibration get that method with the fitted temperature."""
    methods = list(dict.fromkeys(debias))
    unknown = [m for m in methods if m not in DEBIAS_METHODS]
    if unknown or not methods:
        raise ValueError(f"debiasing methods are {', '.join(DEBIAS_METHODS)}, not {', '.join(unknown) or 'none'}")
    if default_debias is not None and default_debias not in methods:
        raise ValueError(f"--default-debias {default_debias} is not calibrated by this run (--debias "
                         f"{' '.join(methods)}): add it to --debias")
    fit, held = split(records, holdout, seed, per_option_count=per_option_count)
    folder = engine.model(model_id).path
    try:
        base = read_calibration(folder)
    except ValueError:
        base = CalibrationFile()  # unreadable: this run writes it afresh
    if base.prompt_format != PROMPT_FORMAT_VERSION:
        base = CalibrationFile()  # fitted on another prompt: none of it holds any more
    bar = _Bar(progress)
    notes: list[str] = []

    async def run(items: list[tuple[Record, Adjustment]], desc: str) -> list[Scored]:
        if not items:
            return []
        with bar(len(items), desc) as shown:
            return await answer_all(engine, model_id, items, context_limit=context_limit, bar=shown)

    # Plain answers: the fit set as it is, the held-out set with contextual calibration (whose
    # answers also carry the plain probabilities).
    plain_fit = await run([(r, Adjustment()) for r in fit], "plain")
    plain_held = await run([(r, Adjustment("none", "contextual")) for r in held], "plain, held out")
    fit_answers: dict[str, list[tuple[float, ...]]] = {"none": [a.probabilities for a, _ in plain_fit]}
    answers: dict[tuple[str, str], list[tuple[float, ...]]] = {
        ("none", "none"): [applied.raw if applied is not None else a.probabilities for a, applied in plain_held]}
    contextual: dict[str, list[tuple[float, ...]]] = {"none": [a.probabilities for a, _ in plain_held]}

    priors: dict[int, Prior] = {}
    if "prior" in methods:
        # Every cyclic shift of the fit set's choice questions (up to the orders `permute` scores).
        estimating = [i for i, r in enumerate(fit) if r.view.kind == "choice"
                      and len(order_shifts(r.view.option_count)) == r.view.option_count]
        items = [(replace(fit[i], view=shifted(fit[i].view, s)), Adjustment())
                 for i in estimating for s in range(1, fit[i].view.option_count)]
        scored = iter(await run(items, "prior: shifted orders"))
        per_shift = [[fit_answers["none"][i], *(next(scored)[0].probabilities
                                                 for _ in range(1, fit[i].view.option_count))] for i in estimating]
        priors = estimate_priors([fit[i] for i in estimating], per_shift)
        if priors:
            base = _merged(base, {}, priors, {})
            write_calibration(folder, base)  # the engine reads them from there for x_debias "prior"
        else:
            notes.append("prior: no choice questions to estimate a positional prior from; the engine estimates "
                         "one from its first requests")

    for method in methods:
        if method == "none":
            continue
        # Debiasing changes choice questions only: the others keep their plain answers.
        fit_choice = [i for i, r in enumerate(fit) if r.view.kind == "choice"]
        held_choice = [i for i, r in enumerate(held) if r.view.kind == "choice"]
        debiased_fit = await run([(fit[i], Adjustment(method)) for i in fit_choice], f"{method}")  # type: ignore[arg-type]
        debiased_held = await run([(held[i], a) for i in held_choice
                                   for a in (Adjustment(method), Adjustment(method, "contextual"))],  # type: ignore[arg-type]
                                  f"{method}, held out")
        fit_rows = list(fit_answers["none"])
        for i, (answer, _) in zip(fit_choice, debiased_fit, strict=True):
            fit_rows[i] = answer.probabilities
        fit_answers[method] = fit_rows
        held_rows = list(answers[("none", "none")])
        context_rows = list(contextual["none"])
        for k, i in enumerate(held_choice):
            held_rows[i] = debiased_held[2 * k][0].probabilities
            context_rows[i] = debiased_held[2 * k + 1][0].probabilities
        answers[(method, "none")] = held_rows
        contextual[method] = context_rows

    temperatures = {m: fit_temperatures(fit, fit_answers[m], per_option_count=per_option_count,
                                        notes=notes if m == methods[0] else None) for m in methods}
    for method in methods:
        lookup = CalibrationFile(temperatures={method: temperatures[method]})
        fitted = []
        for record, row in zip(held, answers[(method, "none")], strict=True):
            t = lookup.temperature(method, record.view.kind, record.view.option_count)
            fitted.append(apply_temperature(row, t) if t is not None else tuple(row))
        answers[(method, "fitted")] = fitted
        answers[(method, "contextual")] = contextual[method]
    order = [("none", "none")] + [(m, c) for m in methods for c in CALIBRATIONS if (m, c) != ("none", "none")]
    answers = {key: answers[key] for key in order}
    gold = [r.gold for r in held]
    kinds = [r.view.kind for r in held]
    measures = measures_of(answers, gold, kinds) if held else []
    if not held:
        notes.append("nothing held out: the fit is not measured")

    report = {"examples": len(records), "fit": len(fit), "held_out_examples": len(held), "seed": seed,
              "holdout": holdout, "per_option_count": per_option_count,
              "held_out": _report_json(measures, methods)}
    merged = _merged(base, temperatures, priors, report)
    if default_debias is not None:
        merged.defaults = {"debias": default_debias, "calibration": "fitted"}
    path = write_calibration(folder, merged)
    return CalibrationReport(model_id, path, len(records), len(fit), len(held), seed, temperatures, priors,
                             measures, answers, gold, kinds, notes)


# What the command prints and draws ------------------------------------------------------------


def format_report(report: CalibrationReport) -> str:
    lines = [f"Calibrated {report.model_id} on {report.records} examples: {report.fit} to fit, "
             f"{report.held_out} held out (seed {report.seed}).", "", "Fitted temperatures:"]
    for method, fitted in report.temperatures.items():
        shown = "  ".join(f"{k} {t:.3g}" for k, t in fitted.items()) or "none (too few examples)"
        lines.append(f"  {method:<8} {shown}")
    if report.priors:
        lines += ["", "Positional priors (option count: per position, first position first):"]
        for n, prior in report.priors.items():
            lines.append(f"  {n}: {' '.join(f'{p:.3f}' for p in prior.probabilities)}  "
                         f"(from {prior.questions} questions)")
    if report.measures:
        lines += ["", "Held out (ECE: expected calibration error, 10 bins; lower is better):"]
        width = max(len(m.label) for m in report.measures)
        lines.append(f"  {'kind':<7} {'method':<{width}} {'n':>5} {'accuracy':>9} {'ECE':>7} {'Brier':>7}")
        previous = None
        for m in report.measures:
            kind = m.kind if m.kind != previous else ""
            previous = m.kind
            lines.append(f"  {kind:<7} {m.label:<{width}} {m.n:>5} {m.accuracy:>9.3f} {m.ece:>7.3f} {m.brier:>7.3f}")
    for note in report.notes:
        lines.append(f"note: {note}")
    lines += ["", f"Wrote {report.path}"]
    return "\n".join(lines)


def plot_reliability(report: CalibrationReport, path: Path) -> Path:
    """A reliability diagram of the held-out answers (all kinds together): per debiasing method,
    accuracy against top-label confidence before calibration, with the fitted temperature and with
    contextual calibration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(report.temperatures)
    fig, axes = plt.subplots(1, len(methods), figsize=(5 * len(methods), 5), squeeze=False)
    for ax, method in zip(axes[0], methods, strict=True):
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect")
        keys = [("none", "none")] + [(method, c) for c in CALIBRATIONS if (method, c) != ("none", "none")]
        for key in keys:
            bins = [b for b in reliability_bins(report.answers[key], report.gold) if b.count]
            ece = expected_calibration_error(report.answers[key], report.gold)
            ax.plot([b.confidence for b in bins], [b.accuracy for b in bins], marker="o",
                    label=f"{method_label(*key)} (ECE {ece:.3f})")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top option)", ylabel="accuracy")
        ax.set_title(f"{report.model_id}\nx_debias {method}, {report.held_out} held out", fontsize="medium")
        ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# The command ------------------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser(
        "calibrate", help="fit and measure a model's decision calibration on labelled examples",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fit the calibration that /v1/decisions applies with x_calibration \"fitted\" (and the\n"
                    "positional priors of x_debias \"prior\") on labelled examples, measure it on a held-out\n"
                    "part of them, and write it into the model's folder (swama-calibration.json; a running\n"
                    "server picks it up). Runs the model in this process.",
        epilog="DATA.jsonl holds one example per line: the input text, one /v1/decisions question (predicate,\n"
               "choice or score, with the route's rules) and the right answer:\n\n"
               f"  {EXAMPLE}\n\n"
               "The answer of a predicate is true or false; of a choice question, one of its choice values;\n"
               "of a score question, the level's index (0 for the first) or its label. Other keys are ignored.\n\n"
               "Prints accuracy, expected calibration error (ECE) and the Brier score on the held-out examples\n"
               "before and after calibration (fitted and contextual), per question kind, and saves a\n"
               "reliability diagram as a PNG.")
    cal.add_argument("model", help="the model alias or id (installed first if missing)")
    cal.add_argument("data", help="the labelled examples, JSON Lines (see below)")
    cal.add_argument("--holdout", type=float, default=0.3, metavar="SHARE",
                     help="the share of each question kind held out to measure the fit (default 0.3; 0: none)")
    cal.add_argument("--seed", type=int, default=0, help="the seed of the held-out split (default 0)")
    cal.add_argument("--debias", nargs="+", choices=DEBIAS_METHODS, default=["none"], metavar="METHOD",
                     help=f"the x_debias methods to calibrate for, any of {', '.join(DEBIAS_METHODS)} (default none)")
    cal.add_argument("--default-debias", choices=DEBIAS_METHODS, default=None, metavar="METHOD",
                     help="make METHOD (one of --debias) with the fitted calibration what this model's decision "
                          "questions get when they name no x_debias or x_calibration (a running server picks it up; "
                          "/v1/models shows it)")
    cal.add_argument("--per-option-count", action="store_true",
                     help=f"also fit a temperature per option count of choice and score questions (with at least "
                          f"{MIN_FIT_PER_COUNT} examples to fit)")
    cal.add_argument("--plot", default=None, metavar="PATH",
                     help="where to save the reliability diagram (default MODEL-reliability.png here)")
    cal.add_argument("--no-plot", action="store_true", help="save no reliability diagram")
    add_options(cal, EngineSettings, only=("context_limit",))
    add_options(cal, RuntimeSettings)
    cal.set_defaults(func=calibrate_command)


def _plot_path(args: argparse.Namespace) -> Path:
    if args.plot:
        return Path(args.plot)
    return Path(f"{args.model.replace('/', '-')}-reliability.png")


async def _in_process(args: argparse.Namespace, records: list[Record], model: str) -> int:
    settings = read(EngineSettings, **given(args, EngineSettings))
    engine = open_engine(settings)
    try:
        installed = engine.model_for(model, Task.DECIDE)
        report = await calibrate(engine, installed.id, records, holdout=args.holdout, seed=args.seed,
                                 debias=args.debias, per_option_count=args.per_option_count,
                                 context_limit=settings.context_limit, progress=True,
                                 default_debias=args.default_debias)
    except ScoringError as exc:
        print(f"error: {Path(args.data).name} {exc.message}", file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    finally:
        await engine.close()
    print(format_report(report))
    if not args.no_plot and report.held_out:
        try:
            path = plot_reliability(report, _plot_path(args))
        except ModuleNotFoundError as exc:  # some installs leave matplotlib out (tools/gpu.sh's runtime bundle)
            print(f"error: the reliability diagram needs {exc.name}, which is not installed: pip install "
                  f"{exc.name}, or pass --no-plot", file=sys.stderr)
            return 1
        print(f"Saved the reliability diagram to {path}")
    return 0


def calibrate_command(args: argparse.Namespace) -> int:
    if not 0 <= args.holdout < 1:
        print(f"error: --holdout must be at least 0 and below 1, not {args.holdout:g}", file=sys.stderr)
        return 2
    if args.default_debias is not None and args.default_debias not in args.debias:
        print(f"error: --default-debias {args.default_debias} is not among the methods calibrated (--debias "
              f"{' '.join(args.debias)}): add it to --debias", file=sys.stderr)
        return 2
    try:
        records = read_records(args.data)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = model_files().find_or_pull(args.model).id
    return asyncio.run(_in_process(args, records, model))
