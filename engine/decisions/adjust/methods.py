"""What a request may ask of a decision answer beyond the plain reading, and what was applied.

Debiasing corrects the model's preference for an option's position in a choice question:
- `permute` scores the question under the cyclic shifts of its options taken in a canonical order
  (sorted by name: the same whatever order the request lists them in; every shift for up to
  `MAX_ORDERS` options, else `MAX_ORDERS` evenly spaced ones) and averages each option's
  log-probability over them, so the answer does not depend on the order at all;
- `prior` divides out the model's positional prior for that many options (PriDe), estimated from
  the cyclic shifts of the first `PRIOR_SAMPLE` such questions (answered as `permute` meanwhile) or
  read from the model's calibration file.

Calibration reshapes any question's probabilities:
- `contextual` divides out the probabilities the model gives the same question about the
  content-free input `CONTENT_FREE_INPUT`;
- `fitted` applies the temperature `swama calibrate` fitted on labelled examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Debias = Literal["none", "permute", "prior"]
Calibration = Literal["none", "contextual", "fitted"]
DEBIAS_METHODS: tuple[str, ...] = get_args(Debias)
CALIBRATION_METHODS: tuple[str, ...] = get_args(Calibration)

MAX_ORDERS = 8  # option orders scored per question by `permute` (and by `prior` while it estimates)
PRIOR_SAMPLE = 16  # questions per option count whose shifts estimate a positional prior
CONTENT_FREE_INPUT = "N/A"


@dataclass(frozen=True)
class Adjustment:
    """What one question asks for; the default is the plain reading."""

    debias: Debias = "none"
    calibration: Calibration = "none"

    @property
    def active(self) -> bool:
        return self.debias != "none" or self.calibration != "none"


NO_ADJUSTMENT = Adjustment()


@dataclass(frozen=True)
class Applied:
    """What was applied to one answer (present when its question asked for anything).

    `debias` is what took effect: `none` for a question it does not apply to (yes/no and score
    questions have no option order to correct), `permute` for a `prior` question answered while the
    prior is still being estimated. `raw` holds the plain reading's probabilities in request order.
    """

    debias: Debias
    calibration: Calibration
    raw: tuple[float, ...]
    orders: int = 1  # option orders scored
    prior: tuple[float, ...] | None = None  # per position, first position first
    prior_questions: int | None = None  # how many questions the prior was estimated from
    prior_source: Literal["file", "estimated", "estimating"] | None = None
    content_free: tuple[float, ...] | None = None  # the content-free input's probabilities, request order
    temperature: float | None = None
