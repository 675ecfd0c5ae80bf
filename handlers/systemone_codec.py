"""`POST /v1/systemone` wire format: strict request parsing, the response and the error body."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from swama.engine.scorer import (
    DecisionError,
    QuestionView,
    ScoredAnswer,
    check_choice_option_names,
    noul_view,
    render_text,
    systemone_choice_view,
    systemone_score_view,
)

from .strict_json import JSONRule, JSONValue, StrictJSONError, parse_strict_json

MAX_BODY_BYTES = 13 * 1024 * 1024
MIN_CHOICES, MAX_CHOICES = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
REFUSED_FIELDS = ("temperature", "prompt_format_version", "return_prompt_token_ids")
QUESTION_TYPES = ("noul", "choice", "score")

BODY_TOO_LARGE = "The request body is larger than 13 MiB."
INVALID_REQUEST_MESSAGE = "Invalid SystemOne request."
NESTED_TOO_DEEPLY = "SystemOne JSON is nested too deeply."
BLANK_INSTRUCTIONS = (
    "Non-empty instructions are required on this decision backend. Supported bounds: a choice needs at "
    "least two options; a score takes 2 to 10 levels."
)
INVALID_ANSWER = "The model returned an invalid SystemOne answer."

_QUESTION_FIELDS = frozenset({"type", "instructions", "criteria"})
_NOUL_CRITERIA_FIELDS = ("true", "false")

SystemOneType = Literal["noul", "choice", "score"]


@dataclass(frozen=True)
class SystemOneQuestion:
    """One question in request order. Criteria keep their original JSON values (``legend`` echoes
    them): ``criteria_true``/``criteria_false`` for noul, ``options`` (name, description) for choice
    and ``levels`` (lowest first) for score."""

    id: str
    type: SystemOneType
    instructions: JSONValue
    criteria_true: JSONValue = None
    criteria_false: JSONValue = None
    options: tuple[tuple[str, JSONValue], ...] = ()
    levels: tuple[JSONValue, ...] = ()


@dataclass(frozen=True)
class SystemOneRequest:
    """``images`` is the raw ``images`` value (``None`` when absent or null), validated later."""

    model: str
    state: JSONValue
    questions: tuple[SystemOneQuestion, ...]
    images: JSONValue = None

    @property
    def state_text(self) -> str:
        return render_text(self.state)


def _refuse(message: str) -> DecisionError:
    return DecisionError(400, message)


def _is_text_object_or_array(value: Any) -> bool:
    return isinstance(value, (str, dict, list))


def _is_blank(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, (dict, list)) and not value


def _first_unknown(obj: dict[str, Any], allowed: Sequence[str] | frozenset[str]) -> str | None:
    unknown = sorted(key for key in obj if key not in allowed)
    return unknown[0] if unknown else None


def _parse_root(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_BODY_BYTES:
        raise DecisionError(413, BODY_TOO_LARGE)
    try:
        root = parse_strict_json(body)
    except StrictJSONError as error:
        if error.rule is JSONRule.DUPLICATE_KEY:
            raise _refuse(f"Duplicate SystemOne object key '{error.key}'.") from None
        if error.rule is JSONRule.TOO_DEEP:
            raise _refuse(NESTED_TOO_DEEPLY) from None
        raise _refuse(INVALID_REQUEST_MESSAGE) from None
    if not isinstance(root, dict):
        raise _refuse("The SystemOne request must be an object.")
    return root


def _check_chat_template_kwargs(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _refuse("chat_template_kwargs must be an object.")
    unknown = _first_unknown(value, ("enable_thinking",))
    if unknown is not None:
        raise _refuse(f"Unknown chat_template_kwargs field '{unknown}'.")
    if "enable_thinking" in value and value["enable_thinking"] is not False:
        raise _refuse("Decisions require enable_thinking=false.")


def _parse_noul(question_id: str, instructions: Any, criteria: Any) -> SystemOneQuestion:
    if criteria is None:
        return SystemOneQuestion(question_id, "noul", instructions)
    if not isinstance(criteria, dict):
        raise _refuse("noul criteria must be an object.")
    unknown = _first_unknown(criteria, _NOUL_CRITERIA_FIELDS)
    if unknown is not None:
        raise _refuse(f"Unknown noul criteria field '{unknown}'.")
    for key in _NOUL_CRITERIA_FIELDS:
        value = criteria.get(key)
        if value is not None and not _is_text_object_or_array(value):
            raise _refuse(f"criteria.{key} must be text, an object, an array, or null.")
    return SystemOneQuestion(
        question_id,
        "noul",
        instructions,
        criteria_true=criteria.get("true"),
        criteria_false=criteria.get("false"),
    )


def _parse_choice(question_id: str, instructions: Any, criteria: Any) -> SystemOneQuestion:
    if not isinstance(criteria, dict):
        raise _refuse("choice criteria must be a map of names to descriptions.")
    if len(criteria) < MIN_CHOICES:
        raise _refuse("a choice needs at least two options on this backend.")
    if len(criteria) > MAX_CHOICES:
        raise _refuse(f"This backend supports at most {MAX_CHOICES} options per choice.")
    for description in criteria.values():
        if description is not None and not _is_text_object_or_array(description):
            raise _refuse("choice description must be text, an object, an array, or null.")
    return SystemOneQuestion(question_id, "choice", instructions, options=tuple(criteria.items()))


def _parse_score(question_id: str, instructions: Any, criteria: Any) -> SystemOneQuestion:
    if not isinstance(criteria, list):
        raise _refuse("score criteria must be an ordered array.")
    if not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
        raise _refuse(f"a score takes {MIN_LEVELS} to {MAX_LEVELS} levels on this backend.")
    for level in criteria:
        if not _is_text_object_or_array(level) or _is_blank(level):
            raise _refuse("Score criteria entries must be non-empty text, objects, or arrays.")
    return SystemOneQuestion(question_id, "score", instructions, levels=tuple(criteria))


def _parse_question(question_id: str, value: Any) -> SystemOneQuestion:
    if not isinstance(value, dict):
        raise _refuse(f"question '{question_id}' must be an object.")
    unknown = _first_unknown(value, _QUESTION_FIELDS)
    if unknown is not None:
        raise _refuse(f"Unknown question '{question_id}' field '{unknown}'.")
    kind = value.get("type")
    if not isinstance(kind, str) or not kind:
        raise _refuse(f"question '{question_id}' type must be a non-empty string.")
    instructions = value.get("instructions")
    if instructions is not None and not _is_text_object_or_array(instructions):
        raise _refuse("instructions must be text, an object, an array, or null.")
    if _is_blank(instructions):
        raise _refuse(BLANK_INSTRUCTIONS)
    criteria = value.get("criteria")
    if kind == "noul":
        return _parse_noul(question_id, instructions, criteria)
    if kind == "choice":
        return _parse_choice(question_id, instructions, criteria)
    if kind == "score":
        return _parse_score(question_id, instructions, criteria)
    raise _refuse("Question type must be noul, choice, or score.")


def parse_systemone_request(body: bytes) -> SystemOneRequest:
    """Validate a request body in Swama's check order. Refusals are ``DecisionError`` 400, or 413
    for a body over 13 MiB. Unknown top-level fields are ignored."""
    root = _parse_root(body)
    model = root.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _refuse("model must be a non-empty string.")
    state = root.get("state")
    if not _is_text_object_or_array(state):
        raise _refuse("state must be text, an object, or an array.")
    raw_questions = root.get("questions")
    if not isinstance(raw_questions, dict) or not raw_questions:
        raise _refuse("questions must be a non-empty map.")
    for field in REFUSED_FIELDS:
        if root.get(field) is not None:
            raise _refuse(f"{field} is not part of this API; use /v1/decisions for it.")
    if root.get("video") is not None:
        raise _refuse("video is not supported on this backend; send images instead.")
    _check_chat_template_kwargs(root.get("chat_template_kwargs"))

    questions = tuple(_parse_question(question_id, value) for question_id, value in raw_questions.items())
    for question in questions:
        if question.type == "choice":
            check_choice_option_names([name for name, _ in question.options])
    return SystemOneRequest(model, state, questions, root.get("images"))


def systemone_question_view(question: SystemOneQuestion) -> QuestionView:
    if question.type == "choice":
        return systemone_choice_view(question.instructions, question.options)
    if question.type == "score":
        return systemone_score_view(question.instructions, question.levels)
    return noul_view(question.instructions, question.criteria_true, question.criteria_false)


# Response -----------------------------------------------------------------------------------


def _finite(*values: float | None) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def _answer_json(question: SystemOneQuestion, answer: ScoredAnswer) -> dict[str, Any]:
    probabilities = [float(p) for p in answer.probabilities]
    expected_kind = {"noul": "yes_no", "choice": "choice", "score": "score"}[question.type]
    expected_count = {"noul": 2, "choice": len(question.options), "score": len(question.levels)}[
        question.type
    ]
    extra = () if question.type == "noul" else (answer.confidence,)
    if question.type == "score":
        extra += (answer.score,)
    if (
        answer.kind != expected_kind
        or len(probabilities) != expected_count
        or not 0 <= answer.choice_index < expected_count
        or not _finite(*probabilities, answer.mass, *extra)
    ):
        raise DecisionError(500, INVALID_ANSWER)
    mass = float(answer.mass)
    if question.type == "noul":
        return {"type": "noul", "noul": probabilities[0], "x_label_mass": mass}
    if question.type == "choice":
        names = [name for name, _ in question.options]
        return {
            "type": "choice",
            "choice": names[answer.choice_index],
            "confidence": float(answer.confidence),  # type: ignore[arg-type]
            "probabilities": dict(zip(names, probabilities, strict=True)),
            "x_label_mass": mass,
        }
    return {
        "type": "score",
        "score": float(answer.score),  # type: ignore[arg-type]
        "confidence": float(answer.confidence),  # type: ignore[arg-type]
        "legend": {str(i): level for i, level in enumerate(question.levels)},
        "probabilities": {str(i): p for i, p in enumerate(probabilities)},
        "x_label_mass": mass,
    }


def render_systemone_response(
    model: str, answers: Sequence[tuple[SystemOneQuestion, ScoredAnswer]], input_tokens: int
) -> bytes:
    """The response body: answers keyed by question id in request order; no confidence on noul."""
    body = {
        "model": model,
        "answers": {question.id: _answer_json(question, answer) for question, answer in answers},
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")

