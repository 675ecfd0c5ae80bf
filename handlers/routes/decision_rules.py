"""What /v1/decisions and /v1/systemone mean the same way: the limits, the answer checks before
rendering, and a request's schema errors located where the user wrote them, for each route to
report the one its check order puts first."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic

from swama.engine.client import (
    LANGUAGE,
    NO_DEFAULTS,
    VISION,
    Adjustment,
    Applied,
    CalibrationCache,
    CalibrationFile,
    Defaults,
    InstalledModel,
    QuestionKind,
    QuestionView,
    ScoredAnswer,
    model_defaults,
)
from swama.handlers.http.errors import ApiError

MAX_QUESTIONS = 200
MIN_CHOICES, MAX_CHOICES = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10

Path = tuple[str | int, ...]


def refuse(message: str) -> ApiError:
    return ApiError(400, message)


def plain(value: Any) -> Any:
    """A generated root model's value as sent (text, object or array); other values as they are."""
    return value.root if isinstance(value, pydantic.RootModel) else value


# Debiasing and calibration ----------------------------------------------------------------


def _method(value: Any) -> str | None:
    return None if value is None else str(value.value if hasattr(value, "value") else value)


_calibrations = CalibrationCache()  # each model folder's calibration file, read again when it changes


def decision_defaults(settings: Any, model: InstalledModel) -> Defaults:
    """What a question that names no debiasing or calibration gets on `model`: its calibration file's
    defaults, else the server's --decision-debias / --decision-calibration (none for a decision
    checkpoint, which answers through its own head)."""
    if model.kind not in (LANGUAGE, VISION):
        return NO_DEFAULTS
    try:
        file = _calibrations.get(model.path)
    except ValueError:  # unreadable: the server's defaults; a question that needs the file is refused by the engine
        file = CalibrationFile()
    return model_defaults(file, settings.decision_debias, settings.decision_calibration)


def adjustment_of(request: Any, question: Any, view: QuestionView, defaults: Defaults = NO_DEFAULTS) -> Adjustment:
    """What a question asks beyond the plain reading: its own `x_debias` / `x_calibration`, else the
    request's (yes/no and score questions have no `x_debias` of their own), else the model's
    defaults."""
    debias = _method(getattr(question, "x_debias", None)) or _method(request.x_debias)
    calibration = _method(getattr(question, "x_calibration", None)) or _method(request.x_calibration)
    return defaults.resolve(debias, calibration, view.kind, view.option_count)


def checkpoint_refusal(model_id: str) -> ApiError:
    return refuse(f"x_debias and x_calibration apply to chat models read through their next-token scores; "
                  f"the decision checkpoint '{model_id}' answers through its own head.")


def adjustment_json(applied: Applied | None) -> dict[str, Any]:
    """The answer's `x_adjustment` field (nothing when its question asked for nothing)."""
    if applied is None:
        return {}
    body: dict[str, Any] = {"debias": applied.debias, "calibration": applied.calibration, "orders": applied.orders,
                            "raw_probabilities": [float(p) for p in applied.raw]}
    if applied.prior is not None:
        body["prior"] = [float(p) for p in applied.prior]
    if applied.prior_questions is not None:
        body["prior_questions"] = applied.prior_questions
    if applied.prior_source is not None:
        body["prior_source"] = applied.prior_source
    if applied.content_free is not None:
        body["content_free"] = [float(p) for p in applied.content_free]
    if applied.temperature is not None:
        body["temperature"] = float(applied.temperature)
    return {"x_adjustment": body}


# Answers ----------------------------------------------------------------------------------


def _finite(*values: float | None) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def answer_is_sound(answer: ScoredAnswer, kind: QuestionKind, option_count: int) -> bool:
    """Whether a scored answer fits its question before it is rendered: the kind, one probability
    per option, the chosen index, and finite numbers (confidence for choice and score, the
    expected score for score)."""
    extra = () if kind == "yes_no" else (answer.confidence,)
    if kind == "score":
        extra += (answer.score,)
    return (
        answer.kind == kind
        and len(answer.probabilities) == option_count
        and 0 <= answer.choice_index < option_count
        and _finite(*answer.probabilities, *(() if answer.mass is None else (answer.mass,)), *extra)
    )


# Schema errors ----------------------------------------------------------------------------

TAG_ERRORS = frozenset({"union_tag_invalid", "union_tag_not_found"})


@dataclass(frozen=True)
class Fault:
    """One schema error: `path` into the decoded JSON (ending in the field's name for a missing or
    unknown field), pydantic's error type, and the value it judged (for a missing field or a
    union tag, the object holding it)."""

    path: Path
    kind: str
    value: Any


_ABSENT = object()


def child(node: Any, part: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(part, _ABSENT) if isinstance(part, str) else _ABSENT
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return _ABSENT


def _located(loc: tuple[Any, ...], data: Any, kind: str) -> Path:
    """The error's place in the data: pydantic's location less its union member and tag names
    (`str`, `list[...]`, `choice`, a generated class name), which the data does not hold."""
    node, path = data, []
    for i, part in enumerate(loc):
        found = child(node, part)
        if found is not _ABSENT:
            node = found
            path.append(part)
        elif kind == "missing" and i == len(loc) - 1:
            path.append(part)
    return tuple(path)


def _below(path: Path, other: Path) -> bool:
    return len(other) > len(path) and other[: len(path)] == path


def faults(exc: pydantic.ValidationError, data: Any) -> list[Fault]:
    """The errors of `exc` located in `data`. A union member that does not take the value's kind
    reports a type error at the union itself; when another member got further (errors below that
    path), that error says nothing about the request and is left out."""
    found = [Fault(_located(e["loc"], data, e["type"]), e["type"], e.get("input"))
             for e in exc.errors(include_url=False)]
    return [f for f in found
            if not (f.kind.endswith("_type") and any(_below(f.path, g.path) for g in found))]


def length_bounds(model: type[pydantic.BaseModel], field: str) -> tuple[int, int]:
    """A list or map field's length limits as the generated model states them."""
    schema = model.model_json_schema()["properties"][field]
    low = schema.get("minItems", schema.get("minProperties", 0))
    return low, schema.get("maxItems", schema.get("maxProperties", 2**63))


def with_lengths(found: list[Fault], data: Any, bounds: Callable[[Path], tuple[int, int] | None]) -> list[Fault]:
    """pydantic judges a list's or map's length only once its items are valid, but the routes
    check the length first: add the length fault a container with bad items would also get."""
    extra: dict[Path, Fault] = {}
    for fault in found:
        for end in range(1, len(fault.path)):
            path = fault.path[:end]
            limits = bounds(path)
            if limits is None or path in extra:
                continue
            node = data
            for part in path:
                node = child(node, part)
            if isinstance(node, (list, dict)) and not limits[0] <= len(node) <= limits[1]:
                extra[path] = Fault(path, "too_short" if len(node) < limits[0] else "too_long", node)
    return found + list(extra.values())
