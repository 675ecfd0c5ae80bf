"""Decision debiasing and calibration on a model, in one process through the engine.

    python -m tools.bench.debias --model smollm2 [--record]
        [--questions 48] [--orders 4] [--warm-up 48] [--labelled 200] [--runs 5] [--seed 0]

Three measures, on question sets built by construction (tools/bench/decision_sets.py):

- Order consistency: each choice question of `order_set` asked under `--orders` orders of its
  options (the original first, then seeded random permutations, all orders of a question in one job
  about its input), with `x_debias` none, permute and prior: the share of questions whose top answer
  (by value) is the same under every order, and the mean total-variation distance between the
  answers' distributions over values (per question, the mean over pairs of orders). `prior` is
  measured after a warm-up on other questions, from which the engine estimates its positional prior
  (its first 16 questions per option count); every measured answer must say `prior_source` estimated.
- Calibration: `labelled_set` through `swama calibrate`'s `calibrate()` (fit on 70%, held out 30%):
  expected calibration error and Brier score before calibration, with the fitted temperature and
  with contextual calibration, on the held-out examples.
- Cost: the wall time of one request of 20 four-option choice questions about one shared input,
  per method (median and spread of `--runs` runs after a warm-up, each run on its own question set);
  contextual calibration both on its first call (which scores the content-free answers) and cached.

The model's files are linked into a temporary store, so the calibration file `calibrate()` writes
never reaches the installed model. `--record` writes the section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from swama.engine.client import (
    Adjustment,
    Applied,
    DecisionJob,
    DecisionResult,
    EngineClient,
    EngineSettings,
    QuestionView,
    open_engine,
    read,
)
from tools.bench.common import (
    BENCHMARKS_MD,
    build_store,
    markdown_table,
    package_version,
    today,
    write_section,
)
from tools.bench.decision_sets import OPTION_COUNTS, labelled_set, order_set, order_set_answers, write_jsonl

TITLE = "Decisions: option-order debiasing and calibration"
COMMAND = "python -m tools.bench.debias"
METHODS = ("none", "permute", "prior")
CONTEXT_LIMIT = 16384
CONSISTENCY_TARGET = 0.9  # share of questions with the same top answer under every order, with permute
COST_TARGET = 2.0  # permute's latency over none's, at most
COST_QUESTIONS = 20
COST_OPTIONS = 4


# ---------------------------------------------------------------------------------------------
# Orders and the metrics (pure)


def option_orders(option_count: int, orders: int, rng: random.Random) -> list[tuple[int, ...]]:
    """`orders` distinct orders of the options (as many as there are, when fewer): the original
    first, then random permutations. Order o shows option o[i] at position i."""
    wanted = min(orders, math.factorial(option_count))
    found = [tuple(range(option_count))]
    while len(found) < wanted:
        order = tuple(rng.sample(range(option_count), option_count))
        if order not in found:
            found.append(order)
    return found


def reordered(view: QuestionView, order: Sequence[int]) -> QuestionView:
    """`view` with its options in `order` (position i shows option order[i])."""
    return replace(view, option_names=tuple(view.option_names[j] for j in order),
                   option_details=tuple(view.option_details[j] for j in order))


def by_value(view: QuestionView, probabilities: Sequence[float]) -> dict[str, float]:
    """An answer's probabilities keyed by option value (request order of `view`)."""
    return dict(zip(view.option_names, probabilities, strict=True))


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    """Half the L1 distance between two distributions over the same values."""
    return 0.5 * math.fsum(abs(p[k] - q.get(k, 0.0)) for k in p)


def mean_pairwise_tv(answers: Sequence[dict[str, float]]) -> float:
    """The mean total-variation distance over pairs of answers (0 for fewer than two)."""
    pairs = list(itertools.combinations(answers, 2))
    return math.fsum(total_variation(p, q) for p, q in pairs) / len(pairs) if pairs else 0.0


def top_value(answer: dict[str, float]) -> str:
    """The value with the highest probability (the first in the answer's order on a tie)."""
    return max(answer, key=answer.__getitem__)


def same_top(answers: Sequence[dict[str, float]]) -> bool:
    """Whether every answer has the same top value."""
    return len({top_value(a) for a in answers}) <= 1


@dataclass
class Consistency:
    """Order consistency of one method over a set of questions (each a list of answers by value,
    one per order)."""

    method: str
    answers: list[list[dict[str, float]]] = field(default_factory=list)
    option_counts: list[int] = field(default_factory=list)
    seconds: float = 0.0
    prior_sources: Counter[str] = field(default_factory=Counter)
    top_positions: Counter[int] = field(default_factory=Counter)  # where the top answer stood (0: first)
    top_probabilities: list[float] = field(default_factory=list)
    right: list[str | None] = field(default_factory=list)  # each question's right value, when known

    def add(self, views: Sequence[QuestionView], answers: Sequence[Sequence[float]], right: str | None = None) -> None:
        """One question's answers under its orders (`views[k]` scored as `answers[k]`, request order)."""
        self.answers.append([by_value(v, p) for v, p in zip(views, answers, strict=True)])
        self.option_counts.append(views[0].option_count)
        self.right.append(right)
        for p in answers:
            self.top_positions[max(range(len(p)), key=p.__getitem__)] += 1
            self.top_probabilities.append(max(p))

    @property
    def accuracy(self) -> float:
        """The share of answers (every order of every question with a known right value) whose top
        value is the right one."""
        tops = [top_value(a) == right for answers, right in zip(self.answers, self.right, strict=True)
                if right is not None for a in answers]
        return statistics.fmean(tops) if tops else float("nan")

    @property
    def chance(self) -> float:
        """The accuracy of a uniform guess over the same questions."""
        counts = [n for n, right in zip(self.option_counts, self.right, strict=True) if right is not None]
        return statistics.fmean(1 / n for n in counts) if counts else float("nan")

    @property
    def chance_first(self) -> float:
        """The share of top answers in the first position if positions did not matter."""
        return statistics.fmean(1 / n for n in self.option_counts) if self.option_counts else float("nan")

    @property
    def first_position_share(self) -> float:
        total = sum(self.top_positions.values())
        return self.top_positions[0] / total if total else float("nan")

    def consistent(self, option_count: int | None = None) -> tuple[int, int]:
        """(questions with the same top answer under every order, questions), for one option count
        or all."""
        chosen = [a for a, n in zip(self.answers, self.option_counts, strict=True)
                  if option_count is None or n == option_count]
        return sum(same_top(a) for a in chosen), len(chosen)

    @property
    def share(self) -> float:
        same, total = self.consistent()
        return same / total if total else float("nan")

    @property
    def mean_tv(self) -> float:
        return statistics.fmean(mean_pairwise_tv(a) for a in self.answers) if self.answers else float("nan")


def spread(values: Sequence[float]) -> str:
    """Median and range of timings, in seconds."""
    return f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"


# ---------------------------------------------------------------------------------------------
# Through the engine


async def decided(engine: EngineClient, model_id: str, job: DecisionJob) -> DecisionResult:
    async for result in engine.decide(model_id, job):
        return result
    raise RuntimeError("the engine gave no answer")


async def ask_orders(engine: EngineClient, model_id: str, text: str, view: QuestionView,
                     orders: Sequence[Sequence[int]], method: str,
                     ) -> tuple[list[QuestionView], list[tuple[float, ...]], list[Applied | None]]:
    """One question under each order, in one job about its input: the views asked, their answers'
    probabilities (request order) and what was applied."""
    views = [reordered(view, o) for o in orders]
    job = DecisionJob(text, views, CONTEXT_LIMIT, adjustments=[Adjustment(method)] * len(views))  # type: ignore[arg-type]
    result = await decided(engine, model_id, job)
    applied = list(result.applied) or [None] * len(views)
    return views, [a.probabilities for a in result.answers], applied


async def warm_prior(engine: EngineClient, model_id: str, items: Sequence[tuple[str, QuestionView]]) -> Counter[str]:
    """Ask `items` with x_debias prior (one job each), so the engine estimates its positional priors:
    what each answer's prior_source said."""
    sources: Counter[str] = Counter()
    for text, view in items:
        result = await decided(engine, model_id, DecisionJob(text, [view], CONTEXT_LIMIT,
                                                             adjustments=[Adjustment("prior")]))
        sources[str(result.applied[0].prior_source if result.applied[0] else None)] += 1
    return sources


async def order_consistency(engine: EngineClient, model_id: str, items: Sequence[tuple[str, QuestionView]],
                            orders: int, seed: int, method: str, right: Sequence[str | None] = ()) -> Consistency:
    rng = random.Random(f"orders/{seed}")  # the same orders for every method
    measured = Consistency(method)
    start = time.perf_counter()
    for i, (text, view) in enumerate(items):
        views, answers, applied = await ask_orders(engine, model_id, text, view,
                                                   option_orders(view.option_count, orders, rng), method)
        measured.add(views, answers, right[i] if i < len(right) else None)
        if method == "prior":
            measured.prior_sources.update(str(a.prior_source if a else None) for a in applied)
    measured.seconds = time.perf_counter() - start
    return measured


def cost_request(seed: int, questions: int = COST_QUESTIONS, options: int = COST_OPTIONS,
                 ) -> tuple[str, list[QuestionView]]:
    """One shared input (numbered short texts) and `questions` choice questions of `options`
    options about it, one per text."""
    items = order_set(questions, seed, (options,))
    text = "\n".join(f"Text {i}: {t}" for i, (t, _) in enumerate(items, start=1))
    views = [replace(v, question=f"About text {i}: {v.question}") for i, (_, v) in enumerate(items, start=1)]
    return text, views


COST_CASES = ("none", "permute", "prior", "contextual, first call", "contextual, cached")


async def timed_request(engine: EngineClient, model_id: str, text: str, views: Sequence[QuestionView],
                        adjustment: Adjustment) -> tuple[float, DecisionResult]:
    job = DecisionJob(text, list(views), CONTEXT_LIMIT, adjustments=[adjustment] * len(views))
    start = time.perf_counter()
    result = await decided(engine, model_id, job)
    return time.perf_counter() - start, result


async def cost(engine: EngineClient, model_id: str, runs: int, seed: int, questions: int = COST_QUESTIONS,
               prior_check: bool = True) -> tuple[dict[str, list[float]], int, float]:
    """Seconds per case over `runs` runs (after one warm-up run), each run on its own request; the
    first three cases in a rotating order. Also the input's tokens, and the orders `permute` scores
    per question on average (the engine's plan: the request's order and the shifts it averages over)."""
    from swama.engine.decisions.adjust.plan import debiasing_orders

    times: dict[str, list[float]] = {case: [] for case in COST_CASES}
    tokens = 0
    scored: list[int] = []
    for run in range(-1, runs):  # run -1 warms up
        text, views = cost_request(seed + 1000 + run, questions)
        scored += [len({tuple(range(v.option_count)), *debiasing_orders(v)}) for v in views]
        first = run % 3
        for method in METHODS[first:] + METHODS[:first]:
            seconds, result = await timed_request(engine, model_id, text, views, Adjustment(method))  # type: ignore[arg-type]
            if prior_check and method == "prior" and any(a is None or a.prior_source != "estimated" for a in result.applied):
                raise SystemExit("the cost of prior is measured with an estimated prior: warm it up first")
            if run >= 0:
                times[method].append(seconds)
        for case in COST_CASES[3:]:
            seconds, result = await timed_request(engine, model_id, text, views, Adjustment("none", "contextual"))
            if run >= 0:
                times[case].append(seconds)
        if run == 0:
            tokens = result.shared_prefix_tokens
    return times, tokens, statistics.fmean(scored)


@dataclass
class CalibrationFigures:
    held_out: int
    fit: int
    rows: dict[tuple[str, str], tuple[float, float, float]]  # (calibration, kind) -> accuracy, ECE, Brier
    temperatures: dict[str, float]
    seconds: float
    chance: dict[str, float] = field(default_factory=dict)  # kind -> accuracy of a uniform guess, held out


async def calibration(engine: EngineClient, model_id: str, records: int, seed: int, work: Path) -> CalibrationFigures:
    from swama.handlers.cli.calibrate import calibrate, read_records

    path = write_jsonl(labelled_set(records, seed), work / "labelled.jsonl")
    start = time.perf_counter()
    report = await calibrate(engine, model_id, read_records(path), holdout=0.3, seed=seed, debias=("none",))
    seconds = time.perf_counter() - start
    rows = {(m.calibration, m.kind): (m.accuracy, m.ece, m.brier) for m in report.measures if m.debias == "none"}
    options = {kind: [len(row) for row, k in zip(report.answers[("none", "none")], report.kinds, strict=True)
                      if k == kind] for kind in set(report.kinds)}
    chance = {kind: statistics.fmean(1 / n for n in counts) for kind, counts in options.items()}
    return CalibrationFigures(report.held_out, report.fit, rows, dict(report.temperatures.get("none", {})), seconds,
                              chance)


def at_bound_note(figures: CalibrationFigures) -> str:
    """What to say of temperatures the fit left at a bound of its search (empty when none)."""
    from swama.engine.decisions.adjust.fit import MAX_TEMPERATURE, MIN_TEMPERATURE

    notes = []
    for kind, t in sorted(figures.temperatures.items()):
        if t >= MAX_TEMPERATURE or t <= MIN_TEMPERATURE:
            accuracy = figures.rows.get(("none", kind), (float("nan"),))[0]
            chance = figures.chance.get(kind, float("nan"))
            notes.append(
                f"The {kind} temperature stopped at the {'upper' if t >= MAX_TEMPERATURE else 'lower'} bound of "
                f"the fit ({t:g}): held out, the plain answers are right {accuracy:.0%} of the time against "
                f"{chance:.0%} for a uniform guess, so the best a temperature can do is "
                + ("flatten them towards uniform: the lower ECE there comes from answers that say less, "
                   "not from better ones."
                   if t >= MAX_TEMPERATURE else "sharpen them as far as it may."))
    return " ".join(notes)



# ---------------------------------------------------------------------------------------------
# The run and the report


@dataclass
class Results:
    model: str
    orders: int
    warm_up: int
    warm_sources: Counter[str]
    consistency: dict[str, Consistency]
    calibration: CalibrationFigures | None
    cost: dict[str, list[float]]
    cost_tokens: int
    runs: int
    load: float
    seconds: float
    load_after: float = float("nan")
    permute_orders: float = float("nan")  # orders permute scored per question in the cost requests

    def per_run_ratio(self, case: str) -> float:
        """The median over runs of the case's time over none's in the same run (the load of the
        machine drifts between runs, less within one)."""
        return statistics.median(a / b for a, b in zip(self.cost[case], self.cost["none"], strict=True))


async def measure(args: argparse.Namespace, work: Path) -> Results:
    load = os.getloadavg()[0]
    started = time.perf_counter()
    installed = open_engine(read(EngineSettings)).model(args.model)  # resolves the name only: nothing loads
    build_store(work / "models", installed.path, installed.id)
    engine = open_engine(read(EngineSettings, models_root=work / "models"))
    try:
        model_id = engine.model(args.model).id
        items = order_set(args.questions, args.seed)
        await ask_orders(engine, model_id, *items[0], [tuple(range(items[0][1].option_count))], "none")  # loads
        consistency: dict[str, Consistency] = {}
        for method in METHODS:
            if method == "prior":
                warm_sources = await warm_prior(engine, model_id, order_set(args.warm_up, args.seed + 1))
            consistency[method] = found = await order_consistency(
                engine, model_id, items, args.orders, args.seed, method, order_set_answers(args.questions, args.seed))
            print(f"order consistency, {method}: {found.consistent()[0]}/{len(found.answers)} same top answer, "
                  f"mean TV {found.mean_tv:.3f} ({found.seconds:.0f} s)", flush=True)
        if args.prior_check and set(consistency["prior"].prior_sources) != {"estimated"}:
            raise SystemExit(f"prior was not estimated for every measured answer: "
                             f"{dict(consistency['prior'].prior_sources)}; raise --warm-up")
        times, tokens, scored = await cost(engine, model_id, args.runs, args.seed, args.cost_questions, args.prior_check)
        print("cost: " + ", ".join(f"{case} {spread(t)}" for case, t in times.items()), flush=True)
        figures = None
        if args.labelled:
            figures = await calibration(engine, model_id, args.labelled, args.seed, work)
            print(f"calibration: {figures.rows} ({figures.seconds:.0f} s)", flush=True)
    finally:
        await engine.close()
    return Results(installed.id, args.orders, args.warm_up, warm_sources, consistency, figures, times, tokens,
                   args.runs, load, time.perf_counter() - started, os.getloadavg()[0], scored)


def prior_sentence(prior: Consistency, none: Consistency) -> str:
    """What `prior`'s consistency says, against no debiasing."""
    said = f"`prior`, which scores a single order, gets {prior.share:.0%}"
    if prior.share >= CONSISTENCY_TARGET:
        return said + " as well."
    if prior.mean_tv < none.mean_tv:
        return (said + f": one prior per option count narrows the differences between orders (mean TV "
                f"{prior.mean_tv:.3f} against {none.mean_tv:.3f}) but leaves the top answer to the order on this model.")
    return said + f", and does not narrow the differences between orders (mean TV {prior.mean_tv:.3f} against " \
                  f"{none.mean_tv:.3f})."


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def command_line(args: argparse.Namespace, defaults: argparse.Namespace) -> str:
    """The command as run, with only the options that differ from their defaults."""
    parts = [COMMAND, "--model", args.model]
    for name, flag in (("questions", "--questions"), ("orders", "--orders"), ("warm_up", "--warm-up"),
                       ("labelled", "--labelled"), ("runs", "--runs"),
                       ("cost_questions", "--cost-questions"), ("seed", "--seed")):
        if getattr(args, name) != getattr(defaults, name):
            parts += [flag, str(getattr(args, name))]
    return " ".join(parts + ["--record"])


def report(results: Results, args: argparse.Namespace, defaults: argparse.Namespace) -> str:
    from swama.engine.runtime import compute_dtype, loaded_blas, will_use_gpu

    c = results.consistency
    model = results.model.split("/")[-1]
    counts = sorted(set(c["none"].option_counts))
    per_count = {n: sum(1 for m in c["none"].option_counts if m == n) for n in counts}
    blas = {"openblas": "OpenBLAS preloaded", "mkl": "MKL preloaded"}.get(loaded_blas() or "", "MLX's bundled BLAS")
    lines = [
        f"Measured {today()} with `{command_line(args, defaults)}`, in one process through the engine "
        f"(`open_engine`): {results.model.split('/')[-1]} ({str(compute_dtype()).split('.')[-1]}) on the "
        f"{'GPU' if will_use_gpu() else 'CPU'}, {os.cpu_count()} CPUs "
        f"({platform.machine()}), {blas}; mlx {package_version('mlx')}, mlx-lm {package_version('mlx-lm')}, "
        f"swama {package_version('swama')}, Python {platform.python_version()}; load average "
        f"{results.load:.1f} before the run and {results.load_after:.1f} after it, the whole run {results.seconds / 60:.0f} min. The question sets are built by "
        f"construction (tools/bench/decision_sets.py, seed {args.seed}); the model's files were linked into a "
        f"temporary store, so the calibration file written by `swama calibrate`'s `calibrate()` stayed out of "
        f"the installed model. Scoring is deterministic, so the consistency and calibration figures come from "
        f"one pass; the timings are medians of {results.runs} runs with their range.", "",
        f"**Order consistency.** {len(c['none'].answers)} choice questions "
        f"({', '.join(f'{per_count[n]} with {n} options' for n in counts)}) about short texts (topics, jobs, "
        f"places, animals, weather, sentiment, numbers; every second one with option descriptions), each asked "
        f"under {results.orders} orders of its options: the original, then seeded random permutations, all "
        f"orders of a question in one request about its input. `permute` averages over the cyclic shifts of the "
        f"options sorted by name, which do not depend on the order a request lists them in; `prior` divides one "
        f"positional prior per option count out of a single order, the engine's estimate from a warm-up of "
        f"{results.warm_up} other questions (the measured answers' prior_source: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(c['prior'].prior_sources.items()))}). Accuracy: the share of "
        f"answers, over every order, whose top value is the right one (known by construction; a uniform guess "
        f"gets {c['none'].chance:.0%}).", "",
        markdown_table(
            ["x_debias", "same top answer under every order",
             *(f"{n} options" for n in counts), "mean TV distance between orders", "accuracy",
             "top answer in first position", "mean top probability", "time"],
            [[m, f"{c[m].consistent()[0]}/{len(c[m].answers)} ({c[m].share:.0%})",
              *(f"{c[m].consistent(n)[0]}/{c[m].consistent(n)[1]}" for n in counts),
              f"{c[m].mean_tv:.3f}", f"{c[m].accuracy:.0%}", f"{c[m].first_position_share:.0%}",
              f"{statistics.fmean(c[m].top_probabilities):.2f}", f"{c[m].seconds:.0f} s"] for m in METHODS]), "",
        f"Target: the same top answer under every order for at least {CONSISTENCY_TARGET:.0%} of questions with "
        f"`permute`: {_met(c['permute'].share >= CONSISTENCY_TARGET)} ({c['permute'].share:.0%}, against "
        f"{c['none'].share:.0%} without debiasing). Without debiasing, the top answer stands in the first "
        f"position in {c['none'].first_position_share:.0%} of the answers ({c['none'].chance_first:.0%} if "
        f"positions did not matter). {prior_sentence(c['prior'], c['none'])} Consistency is not "
        f"accuracy: {model} picks the right value in {c['none'].accuracy:.0%} of the answers without "
        f"debiasing, {c['permute'].accuracy:.0%} with `permute` and {c['prior'].accuracy:.0%} with `prior` "
        f"(a uniform guess: {c['none'].chance:.0%}).", "",
    ]
    cal = results.calibration
    if cal is not None:
        def row(calibration: str, kind: str) -> list[str]:
            acc, ece, brier = cal.rows[(calibration, kind)]
            return [f"{ece:.3f}", f"{brier:.3f}", f"{acc:.0%}"]

        kinds = [k for k in ("yes_no", "choice") if ("none", k) in cal.rows]
        names = {"none": "before", "fitted": "fitted temperature", "contextual": "contextual"}
        temps = ", ".join(f"{k} {t:.2f}" for k, t in sorted(cal.temperatures.items()))
        before, fitted = cal.rows[("none", "all")][1], cal.rows[("fitted", "all")][1]
        lines += [
            f"**Calibration.** {cal.fit + cal.held_out} labelled examples with answers known by construction "
            f"(half yes/no: comparisons of prices, a word on a shopping list, the sentiment of sentences built "
            f"from clearly positive or negative words, a word's category; half choice questions of 3 or 4 "
            f"options: the largest number, the sentiment, a word's category, the city a text names), through "
            f"`calibrate()` of `swama calibrate` (x_debias none): temperatures fitted on {cal.fit} "
            f"({temps}), measured on the {cal.held_out} held out. ECE: expected calibration error, 10 bins "
            f"(lower is better).", "",
            markdown_table(["calibration", "ECE", "Brier", "accuracy",
                            *(f"{k}: ECE / Brier" for k in kinds)],
                           [[names[n], *row(n, "all"),
                             *(" / ".join(row(n, k)[:2]) for k in kinds)] for n in ("none", "fitted", "contextual")]),
            "",
            f"Target: the fitted temperature halves the ECE: {_met(fitted <= before / 2)} "
            f"({before:.3f} to {fitted:.3f}, {fitted / before:.2f}x)." + (f" {note}" if (note := at_bound_note(cal)) else ""), "",
        ]
    t = results.cost
    none = statistics.median(t["none"])
    ratio = results.per_run_ratio("permute")
    lines += [
        f"**Cost.** One request of {args.cost_questions} choice questions of {COST_OPTIONS} options each about one "
        f"shared input ({results.cost_tokens} tokens of shared prefix), each run its own set of texts, the cases "
        f"of a run one after the other. `permute` scores each question in the request's order and in the "
        f"{COST_OPTIONS} cyclic shifts of its options sorted by name, {results.permute_orders:.1f} orders per "
        f"question here, all in the one job; `prior` scores one order, with the estimated prior; `contextual` on "
        f"its first call also scores the {args.cost_questions} questions about the content-free input, then "
        f"remembers them.",
        "",
        markdown_table(["request", "median (range)", "vs none (median of the medians)", "vs none (median per run)"],
                       [[case, spread(v), f"{statistics.median(v) / none:.2f}x",
                         f"{results.per_run_ratio(case):.2f}x"] for case, v in t.items()]), "",
        f"Target: `permute` at most {COST_TARGET:.0f}x the latency of none: {_met(ratio <= COST_TARGET)} "
        f"({ratio:.2f}x, the median of the per-run ratios). The orders share the input's prefill, but on "
        f"the CPU a question's suffix costs as much as a stretch of prefill or more: every order is a row "
        f"of its own whose tokens attend over the whole shared prefix, so the work grows with the orders "
        f"scored, and the request's own order is an extra one unless it happens to be a sorted shift. "
        f"`prior` (once estimated) and `contextual` (once its content-free answers are remembered) cost "
        f"what a plain request does.",
    ]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="the installed model (default smollm2)")
    p.add_argument("--questions", type=int, default=48, help="order-consistency questions (default 48)")
    p.add_argument("--orders", type=int, default=4, help="orders each question is asked in (default 4)")
    p.add_argument("--warm-up", type=int, default=16 * len(OPTION_COUNTS),
                   help="questions that warm the engine's prior estimate before prior is measured (default 48: "
                        "16 per option count)")
    p.add_argument("--labelled", type=int, default=200, help="labelled examples for calibration (0: skip; default 200)")
    p.add_argument("--runs", type=int, default=5, help="timed runs per cost case (default 5)")
    p.add_argument("--cost-questions", type=int, default=COST_QUESTIONS,
                   help=f"questions in the timed request (default {COST_QUESTIONS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-prior-check", dest="prior_check", action="store_false",
                   help="measure prior even when some answers were not given with the estimated prior")
    p.add_argument("--record", type=Path, nargs="?", const=BENCHMARKS_MD, default=None,
                   help="write the section of docs/benchmarks.md (or the file given)")
    return p


def main(argv: list[str] | None = None) -> int:
    from swama.engine.runtime import reexec_with_fast_blas

    p = parser()
    args = p.parse_args(argv)
    reexec_with_fast_blas(sys.argv[1:] if argv is None else argv, module="tools.bench.debias")
    with tempfile.TemporaryDirectory(prefix="swama-bench-debias-") as work:
        results = asyncio.run(measure(args, Path(work)))
    body = report(results, args, p.parse_args([]))
    print(f"## {TITLE}\n\n{body}")
    if args.record is not None:
        write_section(args.record, TITLE, body)
        print(f"wrote the '{TITLE}' section of {args.record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
