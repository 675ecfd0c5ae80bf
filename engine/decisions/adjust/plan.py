"""Debiasing and calibration around the label scorer: which question views to score, and how their
answers combine into one answer per question.

`plan_job` expands each question into the views it needs (a choice question under `permute` into
its option orders, shift 0 first); they all go to the scorer in one job, so the shifts share the
input's prefill and batch with every other question. `combine` turns the scored views back into one
`ScoredAnswer` per question, with what was applied. Content-free answers (for `contextual`) are
scored in a job of their own, once per question view, and remembered with the model.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from swama.engine.decisions.scorer import (
    PROMPT_FORMAT_VERSION,
    DecisionError,
    QuestionView,
    ScoredAnswer,
    answer_from_logprobs,
)

from .methods import MAX_ORDERS, PRIOR_SAMPLE, Adjustment, Applied, Debias
from .store import CalibrationFile, Prior

LOG_FLOOR = 1e-300  # a probability that underflowed to 0 counts as this, so logs stay finite
CONTENT_FREE_MEMORY = 4096  # content-free answers remembered per model


def no_fitted_calibration(model_id: str, debias: str, kind: str) -> str:
    return (f"Model '{model_id}' has no fitted calibration for {kind} questions with x_debias '{debias}': "
            f"run `swama calibrate {model_id} DATA.jsonl` first.")


def order_shifts(option_count: int) -> tuple[int, ...]:
    """The cyclic shifts scored: all of them up to `MAX_ORDERS` options, else `MAX_ORDERS` evenly spaced."""
    if option_count <= MAX_ORDERS:
        return tuple(range(option_count))
    return tuple(sorted({round(i * option_count / MAX_ORDERS) % option_count for i in range(MAX_ORDERS)}))


def shifted(view: QuestionView, shift: int) -> QuestionView:
    """`view` with its options rotated: position i shows option (i + shift) mod n."""
    if shift == 0:
        return view
    n = view.option_count
    order = [(i + shift) % n for i in range(n)]
    return replace(view, option_names=tuple(view.option_names[j] for j in order),
                   option_details=tuple(view.option_details[j] for j in order))


def _logs(probabilities: Sequence[float]) -> list[float]:
    return [math.log(max(p, LOG_FLOOR)) for p in probabilities]


def _normalised(logs: Sequence[float]) -> list[float]:
    top = max(logs)
    total = math.log(math.fsum(math.exp(x - top) for x in logs)) + top
    return [x - total for x in logs]


def averaged_over_shifts(per_shift: Sequence[Sequence[float]], shifts: Sequence[int]) -> list[float]:
    """Each option's log-probability averaged over the orders it was scored in (per_shift[k] is in
    position order for shift shifts[k]); not normalised."""
    n = len(per_shift[0])
    return [math.fsum(_logs(p)[(j - s) % n] for p, s in zip(per_shift, shifts, strict=True)) / len(shifts)
            for j in range(n)]


def position_prior(per_shift: Sequence[Sequence[float]], shifts: Sequence[int]) -> list[float]:
    """One question's positional prior (PriDe): the softmax over positions of each position's
    log-probability averaged over the orders."""
    n = len(per_shift[0])
    mean = [math.fsum(_logs(p)[i] for p in per_shift) / len(per_shift) for i in range(n)]
    return [math.exp(x) for x in _normalised(mean)]


@dataclass
class PriorEstimate:
    """A positional prior being estimated from questions' shifts: the mean of their priors."""

    sums: list[float]
    questions: int = 0

    def add(self, prior: Sequence[float]) -> None:
        self.sums = [a + b for a, b in zip(self.sums, prior, strict=True)]
        self.questions += 1

    @property
    def prior(self) -> Prior:
        return Prior(tuple(s / self.questions for s in self.sums), self.questions)


@dataclass
class AdjustState:
    """What debiasing and calibration keep per model between requests."""

    estimates: dict[tuple[int, int], PriorEstimate] = field(default_factory=dict)  # (format, options)
    content_free: OrderedDict[QuestionView, tuple[float, ...]] = field(default_factory=OrderedDict)

    def prior(self, option_count: int, calibration: CalibrationFile) -> tuple[Prior | None, str | None]:
        """The prior for this many options, from the calibration file first, else estimated from
        enough questions; (None, None) while it is still being estimated."""
        if calibration.prompt_format == PROMPT_FORMAT_VERSION and option_count in calibration.priors:
            return calibration.priors[option_count], "file"
        estimate = self.estimates.get((PROMPT_FORMAT_VERSION, option_count))
        if estimate is not None and estimate.questions >= PRIOR_SAMPLE:
            return estimate.prior, "estimated"
        return None, None

    def estimate(self, option_count: int) -> PriorEstimate:
        return self.estimates.setdefault((PROMPT_FORMAT_VERSION, option_count), PriorEstimate([0.0] * option_count))

    def remembered(self, view: QuestionView) -> tuple[float, ...] | None:
        found = self.content_free.get(view)
        if found is not None:
            self.content_free.move_to_end(view)
        return found

    def remember(self, view: QuestionView, probabilities: tuple[float, ...]) -> None:
        self.content_free[view] = probabilities
        self.content_free.move_to_end(view)
        while len(self.content_free) > CONTENT_FREE_MEMORY:
            self.content_free.popitem(last=False)


@dataclass(frozen=True)
class QuestionPlan:
    view: QuestionView
    adjustment: Adjustment
    debias: Debias  # what takes effect
    shifts: tuple[int, ...]  # the orders scored, shift 0 first
    first: int  # its first view's index in `Plan.views`
    prior: Prior | None = None
    prior_source: str | None = None
    temperature: float | None = None

    @property
    def views(self) -> list[QuestionView]:
        return [shifted(self.view, s) for s in self.shifts]

    @property
    def estimates_prior(self) -> bool:
        return self.adjustment.debias == "prior" and self.prior is None and self.debias == "permute"


@dataclass(frozen=True)
class Plan:
    questions: tuple[QuestionPlan, ...]
    views: tuple[QuestionView, ...]  # every question's views, in order: what the scorer answers

    @property
    def content_free_views(self) -> list[QuestionView]:
        """The views whose content-free answers `contextual` needs, each once, in order."""
        wanted: dict[QuestionView, None] = {}
        for q in self.questions:
            if q.adjustment.calibration == "contextual":
                for view in (q.views if q.debias == "permute" else [q.view]):
                    wanted[view] = None
        return list(wanted)


def plan_job(model_id: str, questions: Sequence[QuestionView], adjustments: Sequence[Adjustment],
             state: AdjustState, calibration: CalibrationFile) -> Plan:
    """The views to score for `questions` under their adjustments (none where `adjustments` is
    shorter); a `fitted` question without a fitted temperature is refused before anything runs."""
    plans: list[QuestionPlan] = []
    views: list[QuestionView] = []
    for i, view in enumerate(questions):
        adjustment = adjustments[i] if i < len(adjustments) else Adjustment()
        debias: Debias = adjustment.debias if view.kind == "choice" else "none"
        prior, source = (state.prior(view.option_count, calibration) if debias == "prior" else (None, None))
        if debias == "prior" and prior is None:
            debias = "permute"  # answered from its shifts while they estimate the prior
        shifts = order_shifts(view.option_count) if debias == "permute" else (0,)
        temperature = None
        if adjustment.calibration == "fitted":
            temperature = calibration.temperature(debias if adjustment.debias != "prior" else "prior",
                                                  view.kind, view.option_count)
            if temperature is None:
                raise DecisionError(400, no_fitted_calibration(model_id, adjustment.debias, view.kind))
        plan = QuestionPlan(view, adjustment, debias, shifts, len(views), prior, source, temperature)
        plans.append(plan)
        views += plan.views
    return Plan(tuple(plans), tuple(views))


def _debiased(plan: QuestionPlan, per_shift: Sequence[Sequence[float]]) -> list[float]:
    if plan.debias == "permute":
        return averaged_over_shifts(per_shift, plan.shifts)
    logs = _logs(per_shift[0])
    if plan.debias == "prior" and plan.prior is not None:
        logs = [x - math.log(max(p, LOG_FLOOR)) for x, p in zip(logs, plan.prior.probabilities, strict=True)]
    return logs


def combine(plan: Plan, answers: Sequence[ScoredAnswer], state: AdjustState,
            ) -> tuple[list[ScoredAnswer], list[Applied | None]]:
    """One answer per question from its scored views (`answers`, in `plan.views` order), with what was
    applied to each (None for a question that asked for nothing). Questions answered while estimating
    a prior add their estimate to it."""
    combined: list[ScoredAnswer] = []
    applied: list[Applied | None] = []
    for q in plan.questions:
        scored = answers[q.first: q.first + len(q.shifts)]
        plain = scored[0]
        if not q.adjustment.active:
            combined.append(plain)
            applied.append(None)
            continue
        per_shift = [a.probabilities for a in scored]
        logs = _debiased(q, per_shift)
        content_free = None
        if q.adjustment.calibration == "contextual":
            cf_views = q.views if q.debias == "permute" else [q.view]
            cf_probabilities = [state.remembered(v) for v in cf_views]
            if any(p is None for p in cf_probabilities):
                raise RuntimeError("content-free answers were not scored before combining")
            cf_logs = _normalised(_debiased(q, cf_probabilities))  # type: ignore[arg-type]
            content_free = tuple(math.exp(x) for x in cf_logs)
            logs = [x - c for x, c in zip(logs, cf_logs, strict=True)]
        if q.temperature is not None:
            logs = [x / q.temperature for x in logs]
        answer = replace(answer_from_logprobs(q.view.kind, _normalised(logs)), mass=plain.mass)
        estimate = None
        if q.estimates_prior and len(q.shifts) == q.view.option_count:
            estimate = state.estimate(q.view.option_count)
            estimate.add(position_prior(per_shift, q.shifts))
        combined.append(answer)
        applied.append(Applied(
            debias=q.debias, calibration=q.adjustment.calibration, raw=plain.probabilities, orders=len(q.shifts),
            prior=q.prior.probabilities if q.prior is not None else None,
            prior_questions=q.prior.questions if q.prior is not None else (estimate.questions if estimate else None),
            prior_source=q.prior_source if q.prior is not None else ("estimating" if estimate else None),  # type: ignore[arg-type]
            content_free=content_free, temperature=q.temperature))
    return combined, applied
