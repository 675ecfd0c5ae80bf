"""POST /v1/decisions on the request pipeline: the route's wording for every refusal, the rules no
schema can say, the question views and the byte-exact response."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pydantic

from swama.engine.scorer import (
    DecisionError,
    QuestionView,
    ScoredAnswer,
    check_choice_option_names,
    decision_choice_view,
    decision_score_view,
    predicate_view,
)
from swama.generated.decisions_models import (
    DecisionChoiceOption,
    DecisionChoiceQuestion,
    DecisionCreateRequest,
    DecisionInputImage,
    DecisionInputMessage,
    DecisionInputText,
    DecisionPredicateQuestion,
    DecisionQuestion,
    DecisionScoreLevel,
    DecisionScoreQuestion,
)
from swama.handlers.decision_rules import (
    MAX_CHOICES,
    MAX_LEVELS,
    MAX_QUESTIONS,
    MIN_CHOICES,
    MIN_LEVELS,
    TAG_ERRORS,
    Fault,
    Path,
    answer_is_sound,
    faults,
    length_bounds,
    refuse,
    with_lengths,
)
from swama.handlers.dispatch import RouteRules
from swama.handlers.errors import ApiError
from swama.handlers.images import ImageRef

MAX_SAFETY_IDENTIFIER = 128

INVALID_REQUEST_MESSAGE = "Invalid decision request."
SGLANG_SHAPE_REMOVED = (
    "The SGLang prompt format 1 request shape was removed from /v1/decisions; send the OpenAI "
    "Decisions format (questions with type, name and instructions)."
)
INVALID_ANSWER = "The model returned an invalid decision answer."
INVALID_CHOICE_ANSWER = "The model returned an invalid choice answer."
INVALID_SCORE_ANSWER = "The model returned an invalid score answer."

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


# Rules on the typed request ---------------------------------------------------------------


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


def _question_problem(questions: Sequence[Question]) -> str | None:
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


def questions_of(request: DecisionCreateRequest) -> list[Question]:
    return [q.root for q in request.questions]


def check_questions(questions: Sequence[Question]) -> None:
    """The rules no schema can say, after the model: names, choice values, option names."""
    problem = _question_problem(questions)
    if problem:
        raise refuse(problem)
    for question in questions:
        if isinstance(question, DecisionChoiceQuestion):
            check_choice_option_names(question_view(question).option_names, MAX_CHOICES)


def input_of(value: str | list[DecisionInputMessage]) -> tuple[str, list[ImageRef]]:
    """Every input text joined with newlines, and the image parts in order."""
    if isinstance(value, str):
        return value, []
    texts: list[str] = []
    images: list[ImageRef] = []
    for i, message in enumerate(value):
        if isinstance(message.content, str):
            texts.append(message.content)
            continue
        for j, part in enumerate(message.content):
            if isinstance(part.root, DecisionInputText):
                texts.append(part.root.text)
            else:
                detail = part.root.detail.value if part.root.detail is not None else None
                images.append(ImageRef(f"input[{i}].content[{j}]", part.root.image_url, detail))
    return "\n".join(texts), images


def question_view(question: Question) -> QuestionView:
    if isinstance(question, DecisionChoiceQuestion):
        return decision_choice_view(question.instructions,
                                    [(c.value.root, c.description) for c in question.choices])
    if isinstance(question, DecisionScoreQuestion):
        return decision_score_view(question.instructions, [(lv.label, lv.description) for lv in question.levels])
    return predicate_view(question.instructions)


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
        problem = _question_problem([DecisionQuestion.model_validate(q).root for q in raw[:index]])
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
    handled=frozenset({"model", "input", "questions", "safety_identifier"}),  # safety_identifier: ignored
    unhandled=lambda name: refuse(f"Unknown decision field '{name}'."),
)


# Response -----------------------------------------------------------------------------------


def _answer_json(question: Question, answer: ScoredAnswer) -> dict[str, Any]:
    probabilities = [float(p) for p in answer.probabilities]
    if isinstance(question, DecisionPredicateQuestion):
        if not answer_is_sound(answer, "yes_no", 2):
            raise DecisionError(500, INVALID_ANSWER)
        return {"type": "predicate", "name": question.name, "probability": probabilities[0]}
    if isinstance(question, DecisionChoiceQuestion):
        if not answer_is_sound(answer, "choice", len(question.choices)):
            raise DecisionError(500, INVALID_CHOICE_ANSWER)
        return {
            "type": "choice",
            "name": question.name,
            "choice": question.choices[answer.choice_index].value.root,
            "probabilities": [
                {"value": choice.value.root, "probability": p}
                for choice, p in zip(question.choices, probabilities, strict=True)
            ],
            "confidence": float(answer.confidence),  # type: ignore[arg-type]
        }
    if not answer_is_sound(answer, "score", len(question.levels)):
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


LABEL_MASS_HEADER = "X-Swama-Label-Mass"


def label_masses(answers: Sequence[ScoredAnswer]) -> str:
    """Comma-separated label masses in answer order ("null" where the model reports none)."""
    return ",".join("null" if a.mass is None else repr(float(a.mass)) for a in answers)


def render_decision_response(
    model: str, answers: Sequence[tuple[Question, ScoredAnswer]], input_tokens: int
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
