"""POST /v1/decisions: the route's exact wording for every refusal, in the route's check order.

`DECISION_RULES` brings it to the request pipeline: the old SGLang shape refused by name, schema
errors of the generated model located where the user wrote them and reported in check order, and
the rules no schema can say about question names and choice values (`question_problem`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pydantic

from swama.generated.decisions_models import (
    DecisionChoiceOption,
    DecisionChoiceQuestion,
    DecisionCreateRequest,
    DecisionInputImage,
    DecisionInputText,
    DecisionPredicateQuestion,
    DecisionQuestion,
    DecisionScoreLevel,
    DecisionScoreQuestion,
)
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import RouteRules
from swama.handlers.routes.decision_rules import (
    MAX_CHOICES,
    MAX_LEVELS,
    MAX_QUESTIONS,
    MIN_CHOICES,
    MIN_LEVELS,
    TAG_ERRORS,
    Fault,
    Path,
    faults,
    length_bounds,
    refuse,
    with_lengths,
)

MAX_SAFETY_IDENTIFIER = 128

INVALID_REQUEST_MESSAGE = "Invalid decision request."
SGLANG_SHAPE_REMOVED = (
    "The SGLang prompt format 1 request shape was removed from /v1/decisions; send the OpenAI "
    "Decisions format (questions with type, name and instructions)."
)

Question = DecisionPredicateQuestion | DecisionChoiceQuestion | DecisionScoreQuestion

_SGLANG_QUESTION_KEYS = ("id", "question", "options")


def _invalid(_: Any) -> ApiError:
    return refuse(INVALID_REQUEST_MESSAGE)


def refuse_sglang_shape(data: dict[str, Any]) -> None:
    # Before the model: the old shape would otherwise be reported as its first unknown field.
    questions = data.get("questions")
    if isinstance(questions, list) and any(
        isinstance(q, dict) and (any(key in q for key in _SGLANG_QUESTION_KEYS) or q.get("type") == "yes_no")
        for q in questions
    ):
        raise refuse(SGLANG_SHAPE_REMOVED)


# Question names and choice values -----------------------------------------------------------


def _value_json(value: str | bool) -> str:
    return json.dumps(value, ensure_ascii=False)


def _choice_value_problem(where: str, choices: Sequence[DecisionChoiceOption], complete: bool = True) -> str | None:
    seen: set[tuple[bool, str | bool]] = set()
    for choice in choices:
        typed = (isinstance(choice.value.root, bool), choice.value.root)
        if typed in seen:
            return f"{where} has the duplicate choice value {_value_json(choice.value.root)}."
        seen.add(typed)
    # The prompt shows a boolean as its JSON text, so "true" and true would read the same.
    for boolean in (True, False) if complete else ():
        if (True, boolean) in seen and (False, _value_json(boolean)) in seen:
            return f"{where} has both the string and the boolean {_value_json(boolean)}; they cannot be told apart."
    return None


def question_problem(questions: Sequence[Question]) -> str | None:
    """The first rule the questions break, in the route's order: per question an explicit null
    name, its choice values, then its name against the names before it."""
    names: set[str] = set()
    for index, question in enumerate(questions):
        if "name" in question.model_fields_set and question.name is None:
            return f"questions[{index}] name must be a string."
        if isinstance(question, DecisionChoiceQuestion):
            problem = _choice_value_problem(f"questions[{index}]", question.choices)
            if problem:
                return problem
        if question.name is not None:
            if question.name in names:
                return f"Duplicate question name '{question.name}'."
            names.add(question.name)
    return None


# Schema errors in the route's words and order ------------------------------------------------

# Each object's fields in the order the route checks them (request, message, part, question,
# choice, level); only the order within one object matters.
_FIELD_ORDER = {
    "model": 0, "safety_identifier": 1, "input": 2, "questions": 3,
    "role": 0, "type": 1, "content": 2,
    "text": 2, "image_url": 2, "detail": 3,
    "name": 2, "instructions": 3, "choices": 4, "levels": 5,
    "value": 0, "label": 0, "description": 1,
}

_PART = "input[{0}].content[{1}]"
_MESSAGES = {
    ("model",): "model must be a non-empty string.",
    ("safety_identifier",):
        f"safety_identifier must be a string of at most {MAX_SAFETY_IDENTIFIER} characters, or null.",
    ("input",): "input must be a string or an array of user messages.",
    ("input", "#"): "input[{0}] must be a message object.",
    ("input", "#", "role"): "input[{0}] role must be user; other roles are not supported.",
    ("input", "#", "type"): "input[{0}] type must be message.",
    ("input", "#", "content"): "input[{0}] content must be a string or an array of parts.",
    ("input", "#", "content", "#"): _PART + " must be an object.",
    ("input", "#", "content", "#", "type"): _PART + " type must be input_text or input_image.",
    ("input", "#", "content", "#", "text"): _PART + " text must be a string.",
    ("input", "#", "content", "#", "image_url"): _PART + " image_url must be a string.",
    ("input", "#", "content", "#", "detail"): _PART + " detail must be low, high, auto, original, or null.",
    ("questions",): f"questions must be an array of 1–{MAX_QUESTIONS} questions.",
    ("questions", "#"): "questions[{0}] must be an object.",
    ("questions", "#", "type"): "questions[{0}] type must be predicate, choice, or score.",
    ("questions", "#", "name"): "questions[{0}] name must be a string.",
    ("questions", "#", "instructions"): "questions[{0}] instructions must be a non-empty string.",
    ("questions", "#", "choices"): f"questions[{{0}}] choices must contain {MIN_CHOICES}–{MAX_CHOICES} entries.",
    ("questions", "#", "choices", "#"): "Each choice must be an object.",
    ("questions", "#", "choices", "#", "value"): "questions[{0}] choice value must be a string or a boolean.",
    ("questions", "#", "choices", "#", "description"): "choice description must be a string.",
    ("questions", "#", "levels"): f"questions[{{0}}] levels must contain {MIN_LEVELS}–{MAX_LEVELS} entries.",
    ("questions", "#", "levels", "#"): "Each score level must be an object.",
    ("questions", "#", "levels", "#", "label"): "questions[{0}] level label must be a non-empty string.",
    ("questions", "#", "levels", "#", "description"): "level description must be a string.",
}

_QUESTION_FIELDS = frozenset().union(
    *(m.model_fields for m in (DecisionPredicateQuestion, DecisionChoiceQuestion, DecisionScoreQuestion)))
_PART_FIELDS = frozenset(DecisionInputText.model_fields) | frozenset(DecisionInputImage.model_fields)
_ENTRY_FIELDS = {"choices": frozenset(DecisionChoiceOption.model_fields),
                 "levels": frozenset(DecisionScoreLevel.model_fields)}


_BOUNDS = {
    ("questions",): length_bounds(DecisionCreateRequest, "questions"),
    ("questions", "#", "choices"): length_bounds(DecisionChoiceQuestion, "choices"),
    ("questions", "#", "levels"): length_bounds(DecisionScoreQuestion, "levels"),
}


def _pattern(path: Path) -> tuple[str, ...]:
    return tuple("#" if isinstance(p, int) else p for p in path)


def _walk_key(path: Path) -> tuple[int, ...]:
    return tuple(p if isinstance(p, int) else _FIELD_ORDER.get(p, len(_FIELD_ORDER)) for p in path)


def _checked_at(fault: Fault) -> Path:
    # A wrong or missing type tag is the object's `type` field going wrong.
    return fault.path + ("type",) if fault.kind in TAG_ERRORS else fault.path


def _untagged_unknowns(fault: Fault) -> Iterator[Path]:
    """Unknown keys of an object whose type tag is wrong: the model checks none of its fields, but
    the route reports its keys that no variant has (and its choice and level entries') first."""
    obj, path = fault.value, fault.path
    if not isinstance(obj, dict):
        return
    in_question = path[0] == "questions"
    allowed = _QUESTION_FIELDS if in_question else _PART_FIELDS
    yield from (path + (key,) for key in obj if key not in allowed)
    for name, fields in _ENTRY_FIELDS.items() if in_question else ():
        entries = obj.get(name)
        for j, entry in enumerate(entries if isinstance(entries, list) else ()):
            if isinstance(entry, dict):
                yield from (path + (name, j, key) for key in entry if key not in fields)


def _message(path: Path) -> str:
    template = _MESSAGES.get(_pattern(path), INVALID_REQUEST_MESSAGE)
    return template.format(*(p for p in path if isinstance(p, int)))


def _earlier_rule(path: Path, data: dict[str, Any]) -> str | None:
    """A typed rule the route checks before the schema error at `path`: one broken by the
    questions before it (which are valid), an explicit null name of its own question, or a
    duplicate among the choice entries before it."""
    if len(path) < 2 or path[0] != "questions":
        return None
    index, raw = path[1], data["questions"]
    try:
        problem = question_problem([DecisionQuestion.model_validate(q).root for q in raw[:index]])
        if problem:
            return problem
        question = raw[index]
        if len(path) > 2 and path[2] in ("instructions", "choices", "levels") and question.get("name", "") is None:
            return f"questions[{index}] name must be a string."
        if len(path) > 3 and path[2] == "choices":
            entries = [DecisionChoiceOption.model_validate(e) for e in question["choices"][: path[3]]]
            return _choice_value_problem(f"questions[{index}]", entries, complete=False)
    except pydantic.ValidationError:
        return None
    return None


def schema_error(exc: pydantic.ValidationError, data: Any) -> ApiError:
    """The route's message for the generated model's errors: unknown fields anywhere first (walking
    the request in order, each object's keys sorted), then the first error in check order."""
    found = with_lengths(faults(exc, data), data, lambda path: _BOUNDS.get(_pattern(path)))
    unknown = [f.path for f in found if f.kind == "extra_forbidden"]
    unknown += [p for f in found if f.kind in TAG_ERRORS for p in _untagged_unknowns(f)]
    if unknown:
        path = min(unknown, key=lambda p: (_walk_key(p[:-1]), p[-1]))
        return refuse(f"Unknown decision field '{path[-1]}'.")
    path = min((_checked_at(f) for f in found), key=_walk_key)
    return refuse(_earlier_rule(path, data) or _message(path))


DECISION_RULES = RouteRules(
    bad_json=_invalid,
    not_object=_invalid,
    before_model=refuse_sglang_shape,
    schema_error=schema_error,
    handled=frozenset({"model", "input", "questions", "safety_identifier",  # safety_identifier: ignored
                       "x_debias", "x_calibration"}),
    unhandled=lambda name: refuse(f"Unknown decision field '{name}'."),
)
