"""Route-independent question views, built from each route's validated question, and
``render_text``: how prompt format 1 writes a request's values as text."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .checks import DecisionError

QuestionKind = Literal["yes_no", "choice", "score"]

MAX_LETTER_OPTIONS = 26
_CONTROL_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def render_text(value: Any) -> str:
    """``null`` → ``""``; a string verbatim; anything else as compact, order-keeping Unicode JSON.

    Numbers print as Python prints them after ``json.loads`` (``1.00`` → ``1.0``, ``1e-7`` →
    ``1e-07``), which is why values must come from a parser that keeps Python's number types.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class QuestionView:
    """What the prompt shows: the question text, option names and their rendered details.

    ``option_details`` holds one string per option; ``""`` means the option has no detail line
    (yes/no) or no description (choice). For a score the names are ``"0"``… and the details are the
    level texts.
    """

    kind: QuestionKind
    question: str
    option_names: tuple[str, ...]
    option_details: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.option_names) != len(self.option_details):
            raise ValueError("option_names and option_details differ in length")

    @property
    def option_count(self) -> int:
        return len(self.option_names)


def _choice_value_text(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


# /v1/decisions ------------------------------------------------------------------------------


def predicate_view(instructions: str) -> QuestionView:
    return QuestionView("yes_no", instructions, ("yes", "no"), ("", ""))


def decision_choice_view(instructions: str, choices: Sequence[tuple[str | bool, str | None]]) -> QuestionView:
    """``choices`` holds ``(value, description)`` pairs in request order."""
    names = tuple(_choice_value_text(value) for value, _ in choices)
    details = tuple(description or "" for _, description in choices)
    return QuestionView("choice", instructions, names, details)


def decision_score_view(instructions: str, levels: Sequence[tuple[str, str | None]]) -> QuestionView:
    """``levels`` holds ``(label, description)`` pairs, lowest first."""
    details = tuple(f"{label}: {description}" if description else label for label, description in levels)
    return QuestionView("score", instructions, tuple(str(i) for i in range(len(levels))), details)


# /v1/systemone ------------------------------------------------------------------------------


def noul_view(instructions: Any, criteria_true: Any = None, criteria_false: Any = None) -> QuestionView:
    details = (render_text(criteria_true), render_text(criteria_false))
    return QuestionView("yes_no", render_text(instructions), ("yes", "no"), details)


def systemone_choice_view(instructions: Any, criteria: Sequence[tuple[str, Any]]) -> QuestionView:
    """``criteria`` holds ``(option name, description)`` pairs in request order."""
    names = tuple(name for name, _ in criteria)
    details = tuple(render_text(description) for _, description in criteria)
    return QuestionView("choice", render_text(instructions), names, details)


def systemone_score_view(instructions: Any, criteria: Sequence[Any]) -> QuestionView:
    details = tuple(render_text(level) for level in criteria)
    return QuestionView(
        "score", render_text(instructions), tuple(str(i) for i in range(len(criteria))), details
    )


# Option-name rule shared by both routes -----------------------------------------------------


def choice_options_message(max_options: int) -> str:
    return f"Choice questions require 2–{max_options} distinct, valid options."


def check_choice_option_names(names: Sequence[str], max_options: int) -> None:
    """Option names must be non-blank, free of control/line-break characters and distinct ignoring
    case and surrounding whitespace, because the prompt could not tell them apart otherwise. The
    refusal states the route's option count, `max_options`: what it accepts, not what labels allow."""
    seen: set[str] = set()
    for name in names:
        key = name.strip().casefold()
        invalid = not key or any(unicodedata.category(ch) in _CONTROL_CATEGORIES for ch in name)
        if invalid or key in seen:
            raise DecisionError(400, choice_options_message(max_options))
        seen.add(key)
