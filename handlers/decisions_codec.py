"""`POST /v1/decisions` wire format: strict request parsing and the byte-exact response."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from swama.engine.scorer import (
    DecisionError,
    QuestionView,
    ScoredAnswer,
    check_choice_option_names,
    decision_choice_view,
    decision_score_view,
    predicate_view,
)

from .strict_json import StrictJSONError, parse_strict_json

MAX_QUESTIONS = 200
MIN_CHOICES, MAX_CHOICES = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MAX_SAFETY_IDENTIFIER = 128
IMAGE_DETAILS = ("low", "high", "auto", "original")

INVALID_REQUEST_MESSAGE = "Invalid decision request."
SGLANG_SHAPE_REMOVED = (
    "The SGLang prompt format 1 request shape was removed from /v1/decisions; send the OpenAI "
    "Decisions format (questions with type, name and instructions)."
)
INVALID_ANSWER = "The model returned an invalid decision answer."
INVALID_CHOICE_ANSWER = "The model returned an invalid choice answer."
INVALID_SCORE_ANSWER = "The model returned an invalid score answer."

_TOP_FIELDS = frozenset({"model", "input", "questions", "safety_identifier"})
_MESSAGE_FIELDS = frozenset({"role", "content", "type"})
_PART_FIELDS = {
    "input_text": frozenset({"type", "text"}),
    "input_image": frozenset({"type", "image_url", "detail"}),
}
_QUESTION_FIELDS = {
    "predicate": frozenset({"type", "name", "instructions"}),
    "choice": frozenset({"type", "name", "instructions", "choices"}),
    "score": frozenset({"type", "name", "instructions", "levels"}),
}
_CHOICE_FIELDS = frozenset({"value", "description"})
_LEVEL_FIELDS = frozenset({"label", "description"})
_SGLANG_QUESTION_KEYS = ("id", "question", "options")

DecisionType = Literal["predicate", "choice", "score"]


@dataclass(frozen=True)
class DecisionImage:
    """An ``input_image`` part as sent; ``field`` (``input[i].content[j]``) names it in refusals."""

    field: str
    image_url: str
    detail: str | None


@dataclass(frozen=True)
class DecisionChoice:
    value: str | bool
    description: str | None = None


@dataclass(frozen=True)
class DecisionLevel:
    label: str
    description: str | None = None


@dataclass(frozen=True)
class DecisionQuestion:
    type: DecisionType
    name: str | None
    instructions: str
    choices: tuple[DecisionChoice, ...] = ()
    levels: tuple[DecisionLevel, ...] = ()


@dataclass(frozen=True)
class DecisionRequest:
    """``input_text`` is every input text joined with newlines; ``images`` keep their order."""

    model: str
    input_text: str
    images: tuple[DecisionImage, ...]
    questions: tuple[DecisionQuestion, ...]
    safety_identifier: str | None = None

    @property
    def low_detail_images(self) -> bool:
        """True when there are images and every one of them asks for ``detail: "low"``."""
        return bool(self.images) and all(image.detail == "low" for image in self.images)


def _refuse(message: str) -> DecisionError:
    return DecisionError(400, message)


# Unknown fields -------------------------------------------------------------------------------


def _unknown_in(obj: Mapping[str, Any], allowed: frozenset[str]) -> str | None:
    unknown = sorted(key for key in obj if key not in allowed)
    return unknown[0] if unknown else None


def _allowed_by_type(obj: Mapping[str, Any], table: Mapping[str, frozenset[str]]) -> frozenset[str]:
    kind = obj.get("type")
    if isinstance(kind, str) and kind in table:
        return table[kind]
    return frozenset().union(*table.values())  # an unknown type is reported later, by its own rule


def _first_unknown_field(root: Mapping[str, Any]) -> str | None:
    """The first unknown key, walking the document in order and sorting each object's keys."""
    found = _unknown_in(root, _TOP_FIELDS)
    if found:
        return found
    messages = root.get("input")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        found = _unknown_in(message, _MESSAGE_FIELDS)
        if found:
            return found
        parts = message.get("content")
        for part in parts if isinstance(parts, list) else ():
            if isinstance(part, dict):
                found = _unknown_in(part, _allowed_by_type(part, _PART_FIELDS))
                if found:
                    return found
    questions = root.get("questions")
    for question in questions if isinstance(questions, list) else ():
        if not isinstance(question, dict):
            continue
        found = _unknown_in(question, _allowed_by_type(question, _QUESTION_FIELDS))
        if found:
            return found
        for key, allowed in (("choices", _CHOICE_FIELDS), ("levels", _LEVEL_FIELDS)):
            entries = question.get(key)
            for entry in entries if isinstance(entries, list) else ():
                if isinstance(entry, dict):
                    found = _unknown_in(entry, allowed)
                    if found:
                        return found
    return None


def _is_sglang_shape(root: Mapping[str, Any]) -> bool:
    questions = root.get("questions")
    return isinstance(questions, list) and any(
        isinstance(q, dict) and (any(key in q for key in _SGLANG_QUESTION_KEYS) or q.get("type") == "yes_no")
        for q in questions
    )


# Fields -------------------------------------------------------------------------------------


def _parse_input(value: Any) -> tuple[str, tuple[DecisionImage, ...]]:
    if isinstance(value, str):
        return value, ()
    if not isinstance(value, list):
        raise _refuse("input must be a string or an array of user messages.")
    texts: list[str] = []
    images: list[DecisionImage] = []
    for i, message in enumerate(value):
        field = f"input[{i}]"
        if not isinstance(message, dict):
            raise _refuse(f"{field} must be a message object.")
        if message.get("role") != "user":
            raise _refuse(f"{field} role must be user; other roles are not supported.")
        if "type" in message and message["type"] != "message":
            raise _refuse(f"{field} type must be message.")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                _parse_part(f"{field}.content[{j}]", part, texts, images)
        else:
            raise _refuse(f"{field} content must be a string or an array of parts.")
    return "\n".join(texts), tuple(images)


def _parse_part(field: str, part: Any, texts: list[str], images: list[DecisionImage]) -> None:
    if not isinstance(part, dict):
        raise _refuse(f"{field} must be an object.")
    kind = part.get("type")
    if kind == "input_text":
        text = part.get("text")
        if not isinstance(text, str):
            raise _refuse(f"{field} text must be a string.")
        texts.append(text)
    elif kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise _refuse(f"{field} image_url must be a string.")
        detail = part.get("detail")
        if detail is not None and not (isinstance(detail, str) and detail in IMAGE_DETAILS):
            raise _refuse(f"{field} detail must be low, high, auto, original, or null.")
        images.append(DecisionImage(field, url, detail))
    else:
        raise _refuse(f"{field} type must be input_text or input_image.")


def _choice_value_json(value: str | bool) -> str:
    return json.dumps(value, ensure_ascii=False)


def _parse_choices(field: str, value: Any) -> tuple[DecisionChoice, ...]:
    if not isinstance(value, list) or not MIN_CHOICES <= len(value) <= MAX_CHOICES:
        raise _refuse(f"{field} choices must contain {MIN_CHOICES}–{MAX_CHOICES} entries.")
    choices: list[DecisionChoice] = []
    seen: set[tuple[bool, str | bool]] = set()
    for entry in value:
        if not isinstance(entry, dict):
            raise _refuse("Each choice must be an object.")
        choice_value = entry.get("value")
        if not isinstance(choice_value, (str, bool)):
            raise _refuse(f"{field} choice value must be a string or a boolean.")
        description = entry.get("description")
        if "description" in entry and not isinstance(description, str):
            raise _refuse("choice description must be a string.")
        typed = (isinstance(choice_value, bool), choice_value)
        if typed in seen:
            raise _refuse(f"{field} has the duplicate choice value {_choice_value_json(choice_value)}.")
        seen.add(typed)
        choices.append(DecisionChoice(choice_value, description))
    # The prompt shows a boolean as its JSON text, so "true" and true would read the same.
    for boolean in (True, False):
        if (True, boolean) in seen and (False, _choice_value_json(boolean)) in seen:
            raise _refuse(
                f"{field} has both the string and the boolean {_choice_value_json(boolean)}; "
                "they cannot be told apart."
            )
    return tuple(choices)


def _parse_levels(field: str, value: Any) -> tuple[DecisionLevel, ...]:
    if not isinstance(value, list) or not MIN_LEVELS <= len(value) <= MAX_LEVELS:
        raise _refuse(f"{field} levels must contain {MIN_LEVELS}–{MAX_LEVELS} entries.")
    levels: list[DecisionLevel] = []
    for entry in value:
        if not isinstance(entry, dict):
            raise _refuse("Each score level must be an object.")
        label = entry.get("label")
        if not isinstance(label, str) or not label.strip():
            raise _refuse(f"{field} level label must be a non-empty string.")
        description = entry.get("description")
        if "description" in entry and not isinstance(description, str):
            raise _refuse("level description must be a string.")
        levels.append(DecisionLevel(label, description))
    return tuple(levels)


def _parse_question(index: int, value: Any) -> DecisionQuestion:
    field = f"questions[{index}]"
    if not isinstance(value, dict):
        raise _refuse(f"{field} must be an object.")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in _QUESTION_FIELDS:
        raise _refuse(f"{field} type must be predicate, choice, or score.")
    name = value.get("name")
    if "name" in value and not isinstance(name, str):
        raise _refuse(f"{field} name must be a string.")
    instructions = value.get("instructions")
    if not isinstance(instructions, str) or not instructions.strip():
        raise _refuse(f"{field} instructions must be a non-empty string.")
    if kind == "choice":
        return DecisionQuestion(
            "choice", name, instructions, choices=_parse_choices(field, value.get("choices"))
        )
    if kind == "score":
        return DecisionQuestion("score", name, instructions, levels=_parse_levels(field, value.get("levels")))
    return DecisionQuestion("predicate", name, instructions)


def parse_decision_request(body: bytes) -> DecisionRequest:
    """Validate a request body in Swama's check order; every refusal is ``DecisionError(400, …)``."""
    try:
        root = parse_strict_json(body)
    except StrictJSONError:
        raise _refuse(INVALID_REQUEST_MESSAGE) from None
    if not isinstance(root, dict):
        raise _refuse(INVALID_REQUEST_MESSAGE)
    if _is_sglang_shape(root):
        raise _refuse(SGLANG_SHAPE_REMOVED)
    unknown = _first_unknown_field(root)
    if unknown is not None:
        raise _refuse(f"Unknown decision field '{unknown}'.")

    model = root.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _refuse("model must be a non-empty string.")
    safety_identifier = root.get("safety_identifier")
    if safety_identifier is not None and (
        not isinstance(safety_identifier, str) or len(safety_identifier) > MAX_SAFETY_IDENTIFIER
    ):
        raise _refuse(
            f"safety_identifier must be a string of at most {MAX_SAFETY_IDENTIFIER} characters, or null."
        )
    input_text, images = _parse_input(root.get("input"))

    raw_questions = root.get("questions")
    if not isinstance(raw_questions, list) or not 1 <= len(raw_questions) <= MAX_QUESTIONS:
        raise _refuse(f"questions must be an array of 1–{MAX_QUESTIONS} questions.")
    questions: list[DecisionQuestion] = []
    names: set[str] = set()
    for index, raw in enumerate(raw_questions):
        question = _parse_question(index, raw)
        if question.name is not None:
            if question.name in names:
                raise _refuse(f"Duplicate question name '{question.name}'.")
            names.add(question.name)
        questions.append(question)
    for question in questions:
        if question.type == "choice":
            check_choice_option_names(decision_question_view(question).option_names)
    return DecisionRequest(model, input_text, images, tuple(questions), safety_identifier)


def decision_question_view(question: DecisionQuestion) -> QuestionView:
    if question.type == "choice":
        return decision_choice_view(
            question.instructions, [(c.value, c.description) for c in question.choices]
        )
    if question.type == "score":
        return decision_score_view(
            question.instructions, [(lv.label, lv.description) for lv in question.levels]
        )
    return predicate_view(question.instructions)


# Response -----------------------------------------------------------------------------------


def _finite(*values: float | None) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def _answer_json(question: DecisionQuestion, answer: ScoredAnswer) -> dict[str, Any]:
    probabilities = [float(p) for p in answer.probabilities]
    if question.type == "predicate":
        if answer.kind != "yes_no" or len(probabilities) != 2 or not _finite(*probabilities):
            raise DecisionError(500, INVALID_ANSWER)
        return {"type": "predicate", "name": question.name, "probability": probabilities[0]}
    if question.type == "choice":
        n = len(question.choices)
        if (
            answer.kind != "choice"
            or len(probabilities) != n
            or not 0 <= answer.choice_index < n
            or not _finite(*probabilities, answer.confidence)
        ):
            raise DecisionError(500, INVALID_CHOICE_ANSWER)
        return {
            "type": "choice",
            "name": question.name,
            "choice": question.choices[answer.choice_index].value,
            "probabilities": [
                {"value": choice.value, "probability": p}
                for choice, p in zip(question.choices, probabilities, strict=True)
            ],
            "confidence": float(answer.confidence),  # type: ignore[arg-type]
        }
    if (
        answer.kind != "score"
        or len(probabilities) != len(question.levels)
        or not _finite(*probabilities, answer.score, answer.confidence)
    ):
        raise DecisionError(500, INVALID_SCORE_ANSWER)
    return {
        "type": "score",
        "name": question.name,
        "score": float(answer.score),  # type: ignore[arg-type]
        "probabilities": [
            {"value": i, "label": level.label, "probability": p}
            for i, (level, p) in enumerate(zip(question.levels, probabilities, strict=True))
        ],
        "confidence": float(answer.confidence),  # type: ignore[arg-type]
    }


def render_decision_response(
    model: str, answers: Sequence[tuple[DecisionQuestion, ScoredAnswer]], input_tokens: int
) -> bytes:
    """The response body: answers in question order, ``name`` null when absent, typed values."""
    body = {
        "model": model,
        "answers": [_answer_json(question, answer) for question, answer in answers],
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens,
        },
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")

