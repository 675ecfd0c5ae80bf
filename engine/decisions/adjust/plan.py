"""Debiasing and calibration around the label scorer: which question views to score, and how their
answers combine into one answer per question.

`plan_job` expands each question into the views it needs (a choice question under `permute` into
the request's order, then the cyclic shifts of its options' canonical order); they all go to the
scorer in one job, so the orders share the input's prefill and batch with every other question.
`combine` turns the scored views back into one `ScoredAnswer` per question, with what was applied. Content-free answers (for `contextual`) are
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


Order = tuple[int, ...]  # position -> the option (its index in request order) shown there


def arranged(view: QuestionView, order: Order) -> QuestionView:
    """`view` with option `order[i]` shown at position i."""
    if order == tuple(range(view.option_count)):
        return view
    return replace(view, option_names=tuple(view.option_names[j] for j in order),
                   option_details=tuple(view.option_details[j] for j in order))


def shifted(view: QuestionView, shift: int) -> QuestionView:
    """`view` with its options rotated: position i shows option (i + shift) mod n."""
    n = view.option_count
    return arranged(view, tuple((i + shift) % n for i in range(n)))


def canonical_order(view: QuestionView) -> Order:
    """The options sorted by name (distinct ignoring case and surrounding space, as the routes check),
    then detail: the same for every order a request may list them in."""
    return tuple(sorted(range(view.option_count), key=lambda j: (view.option_names[j].strip().casefold(),
                                                                 view.option_names[j], view.option_details[j])))


def debiasing_orders(view: QuestionView) -> tuple[Order, ...]:
    """The orders `permute` averages over: the cyclic shifts of the canonical order. They depend only
    on the set of options, so the answer is the same whatever order the request lists them in (and
    each option takes every position once, which is what a positional prior is estimated from)."""
    base, n = canonical_order(view), view.option_count
    return tuple(tuple(base[(i + s) % n] for i in range(n)) for s in order_shifts(n))


def floored_logs(probabilities: Sequence[float]) -> list[float]:
    return [math.log(max(p, LOG_FLOOR)) for p in probabilities]


def _normalised(logs: Sequence[float]) -> list[float]:
    top = max(logs)
    total = math.log(math.fsum(math.exp(x - top) for x in logs)) + top
    return [x - total for x in logs]


def averaged_over_orders(per_order: Sequence[Sequence[float]], orders: Sequence[Order]) -> list[float]:
    """Each option's log-probability averaged over the orders it was scored in (per_order[k] is in
    position order for orders[k]); not normalised."""
    n = len(per_order[0])
    total = [0.0] * n
    for probabilities, order in zip(per_order, orders, strict=True):
        for position, log_p in enumerate(floored_logs(probabilities)):
            total[order[position]] += log_p
    return [x / len(orders) for x in total]


def position_prior(per_order: Sequence[Sequence[float]], orders: Sequence[object] = ()) -> list[float]:
    """One question's positional prior (PriDe): the softmax over positions of each position's
    log-probability averaged over orders in which every option took every position once."""
    n = len(per_order[0])
    mean = [math.fsum(floored_logs(p)[i] for p in per_order) / len(per_order) for i in range(n)]
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
    orders: tuple[Order, ...]  # the orders averaged over (permute), or the request's order alone
    first: int  # its first view's index in `Plan.views`
    prior: Prior | None = None
    prior_source: str | None = None
    temperature: float | None = None

    @property
    def scored(self) -> tuple[Order, ...]:
        """The orders scored: the request's own first (the plain reading), then the others averaged."""
        plain = tuple(range(self.view.option_count))
        return (plain, *(o for o in self.orders if o != plain))

    @property
    def views(self) -> list[QuestionView]:
        return [arranged(self.view, order) for order in self.scored]

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
                for view in q.views:
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
        orders = debiasing_orders(view) if debias == "permute" else (tuple(range(view.option_count)),)
        temperature = None
        if adjustment.calibration == "fitted":
            # Fitted per debiasing method asked for; yes/no and score questions are never debiased,
            # so the plain reading's temperature serves them under any method.
            temperature = calibration.temperature(adjustment.debias, view.kind, view.option_count)
            if temperature is None and view.kind != "choice":
                temperature = calibration.temperature("none", view.kind, view.option_count)
            if temperature is None:
                raise DecisionError(400, no_fitted_calibration(model_id, adjustment.debias, view.kind))
        plan = QuestionPlan(view, adjustment, debias, orders, len(views), prior, source, temperature)
        plans.append(plan)
        views += plan.views
    return Plan(tuple(plans), tuple(views))


def _debiased(plan: QuestionPlan, scored: Sequence[Sequence[float]]) -> list[float]:
    """Log-probabilities per option (request order) from the answers to `plan.scored`, debiased."""
    if plan.debias == "permute":
        by_order = dict(zip(plan.scored, scored, strict=True))
        return averaged_over_orders([by_order[o] for o in plan.orders], plan.orders)
    logs = floored_logs(scored[0])
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
        scored = answers[q.first: q.first + len(q.scored)]
        plain = scored[0]
        if not q.adjustment.active:
            combined.append(plain)
            applied.append(None)
            continue
        per_order = [a.probabilities for a in scored]
        logs = _debiased(q, per_order)
        content_free = None
        if q.adjustment.calibration == "contextual":
            cf_probabilities = [state.remembered(v) for v in q.views]
            if any(p is None for p in cf_probabilities):
                raise RuntimeError("content-free answers were not scored before combining")
            cf_logs = _normalised(_debiased(q, cf_probabilities))  # type: ignore[arg-type]
            content_free = tuple(math.exp(x) for x in cf_logs)
            logs = [x - c for x, c in zip(logs, cf_logs, strict=True)]
        if q.temperature is not None:
            logs = [x / q.temperature for x in logs]
        answer = replace(answer_from_logprobs(q.view.kind, _normalised(logs)), mass=plain.mass)
        estimate = None
        if q.estimates_prior and len(q.orders) == q.view.option_count:
            by_order = dict(zip(q.scored, per_order, strict=True))
            estimate = state.estimate(q.view.option_count)
            estimate.add(position_prior([by_order[o] for o in q.orders]))
        combined.append(answer)
        applied.append(Applied(
            debias=q.debias, calibration=q.adjustment.calibration, raw=plain.probabilities, orders=len(q.orders),
            prior=q.prior.probabilities if q.prior is not None else None,
            prior_questions=q.prior.questions if q.prior is not None else (estimate.questions if estimate else None),
            prior_source=q.prior_source if q.prior is not None else ("estimating" if estimate else None),  # type: ignore[arg-type]
            content_free=content_free, temperature=q.temperature))
    return combined, applied
