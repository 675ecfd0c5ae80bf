"""POST /v1/systemone: the route's exact wording for every refusal, in the route's check order.

`SYSTEMONE_RULES` brings it to the request pipeline (Clef's routes reuse it): strict-JSON refusals
in System One's words, numeric `enable_thinking` refused before the model, and the generated
model's errors located where the user wrote them and reported in the route's check order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pydantic

from swama.engine.client import choice_options_message
from swama.generated.systemone_models import (
    SystemOneChoiceQuestion,
    SystemOneNoulQuestion,
    SystemOneScoreQuestion,
)
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import RouteRules
from swama.handlers.http.strict_json import JSONRule, StrictJSONError
from swama.handlers.routes.decision_rules import (
    MAX_CHOICES,
    MAX_LEVELS,
    MIN_LEVELS,
    TAG_ERRORS,
    Fault,
    Path,
    faults,
    length_bounds,
    refuse,
    with_lengths,
)

INVALID_REQUEST_MESSAGE = "Invalid SystemOne request."
NESTED_TOO_DEEPLY = "SystemOne JSON is nested too deeply."
BLANK_INSTRUCTIONS = (
    "Non-empty instructions are required on this decision backend. Supported bounds: a choice needs at "
    "least two options; a score takes 2 to 10 levels."
)
REFUSED_FIELDS = ("temperature", "prompt_format_version", "return_prompt_token_ids")

Question = SystemOneNoulQuestion | SystemOneChoiceQuestion | SystemOneScoreQuestion
Questions = list[tuple[str, Question]]


def _bad_json(error: StrictJSONError | None) -> ApiError:
    if error is not None and error.rule is JSONRule.DUPLICATE_KEY:
        return refuse(f"Duplicate SystemOne object key '{error.key}'.")
    if error is not None and error.rule is JSONRule.TOO_DEEP:
        return refuse(NESTED_TOO_DEEPLY)
    return refuse(INVALID_REQUEST_MESSAGE)


def _not_object(_: Any) -> ApiError:
    return refuse("The SystemOne request must be an object.")


# Schema errors in the route's words and order ------------------------------------------------

# Top-level fields in the order the route checks them; the questions' own fields come after the
# extensions, and images (refused later anyway) last.
_ROOT_ORDER = {"model": 0, "state": 1, "questions": 2, "temperature": 3, "prompt_format_version": 4,
               "return_prompt_token_ids": 5, "video": 6, "chat_template_kwargs": 7}
_EACH_QUESTION, _IMAGES = 8, 9
_QUESTION_ORDER = {"type": 0, "instructions": 1, "criteria": 2}
_INNER_ORDER = {"true": 0, "false": 1, "enable_thinking": 0, "content_type": 0, "base64": 1}
_QUESTION_KEYS = frozenset(_QUESTION_ORDER)
_CRITERIA_BOUNDS = {"choice": length_bounds(SystemOneChoiceQuestion, "criteria"),
                    "score": length_bounds(SystemOneScoreQuestion, "criteria")}


def _bounds(path: Path, data: dict[str, Any]) -> tuple[int, int] | None:
    if len(path) == 3 and path[0] == "questions" and path[2] == "criteria":
        return _CRITERIA_BOUNDS.get(data["questions"][path[1]].get("type"))
    return None


def refuse_numeric_thinking(data: dict[str, Any]) -> None:
    # Before the model: it takes a numeric 0 for enable_thinking=false, which JSON does not.
    kwargs = data.get("chat_template_kwargs")
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    if isinstance(thinking, (int, float)) and not isinstance(thinking, bool):
        raise refuse("Decisions require enable_thinking=false.")


def _instructions_fail(value: Any) -> bool:
    try:
        SystemOneNoulQuestion.model_validate({"type": "noul", "instructions": value})
    except pydantic.ValidationError:
        return True
    return False


def _expand(fault: Fault, data: dict[str, Any]) -> Iterator[Fault]:
    """A question whose type tag is wrong has none of its fields checked by the model; the route
    checks its keys, then that the type is a non-empty string, then its instructions, and only
    then refuses the type."""
    if fault.kind not in TAG_ERRORS:
        yield fault
        return
    question, path = fault.value, fault.path
    yield from (Fault(path + (key,), "extra_forbidden", None) for key in question if key not in _QUESTION_KEYS)
    kind = question.get("type")
    if not isinstance(kind, str) or not kind:
        yield Fault(path + ("type",), "type_blank", kind)
        return
    if "instructions" not in question:
        yield Fault(path + ("instructions",), "missing", question)
    elif _instructions_fail(question["instructions"]):
        yield Fault(path + ("instructions",), "invalid", question["instructions"])
    else:
        yield Fault(path + ("type",), "type_unknown", kind)


def _walk_key(fault: Fault, data: dict[str, Any]) -> tuple[Any, ...]:
    """Where the route checks `fault`: a tuple of (0, name) for an unknown key, which comes before
    the object's fields and is sorted by name, and (1, rank) for a field, an entry or a map key."""
    path = fault.path
    names: list[str | int] = list(path[:-1]) if fault.kind == "extra_forbidden" else list(path)
    head = path[0]
    if head == "questions" and len(path) > 1:
        key: list[Any] = [_EACH_QUESTION]
    else:
        key = [_ROOT_ORDER.get(str(head), _IMAGES)]
    node = data.get(head)
    choice = head == "questions" and len(path) > 3 and data["questions"][path[1]].get("type") == "choice"
    for depth, part in enumerate(names[1:], start=1):
        if isinstance(part, int):
            rank = part
        elif head == "questions" and depth == 2:
            rank = _QUESTION_ORDER.get(part, len(_QUESTION_ORDER))
        elif (head == "questions" and depth == 1) or (choice and depth == 3):
            rank = list(node).index(part)  # question ids and choice options in request order
        else:
            rank = _INNER_ORDER.get(part, 0)
        key.append((1, rank))
        node = node.get(part) if isinstance(node, dict) else None
    if fault.kind == "extra_forbidden":
        key.append((0, path[-1]))
    return tuple(key)


# What the schema says of a choice option name (a criteria key: propertyNames) fails with these; a
# description, the only other thing at that depth, has no length or pattern to fail.
_OPTION_NAME_ERRORS = frozenset({"string_too_short", "string_pattern_mismatch"})


def _is_option_name(fault: Fault, data: dict[str, Any]) -> bool:
    path = fault.path
    return (fault.kind in _OPTION_NAME_ERRORS and len(path) == 4 and path[0] == "questions"
            and path[2] == "criteria" and data["questions"][path[1]].get("type") == "choice")


def _check_order(fault: Fault, data: dict[str, Any]) -> tuple[bool, tuple[Any, ...]]:
    """The route's check order: an option name is judged with the others (distinct ignoring case)
    once every schema rule holds, so its fault comes after every other."""
    return _is_option_name(fault, data), _walk_key(fault, data)


def _is_text_object_or_array(value: Any) -> bool:
    return isinstance(value, (str, dict, list))


def _criteria_message(question: dict[str, Any], fault: Fault) -> str:
    kind = question.get("type")
    if kind == "noul":
        return "noul criteria must be an object."
    if kind == "choice":
        if fault.kind == "too_short":
            return "a choice needs at least two options on this backend."
        if fault.kind == "too_long":
            return f"This backend supports at most {MAX_CHOICES} options per choice."
        return "choice criteria must be a map of names to descriptions."
    if fault.kind in ("too_short", "too_long"):
        return f"a score takes {MIN_LEVELS} to {MAX_LEVELS} levels on this backend."
    return "score criteria must be an ordered array."


def _question_message(question_id: str, question: Any, rest: tuple[Any, ...], fault: Fault) -> str:
    if not rest:
        return f"question '{question_id}' must be an object."
    if len(rest) == 1 and fault.kind == "extra_forbidden":
        return f"Unknown question '{question_id}' field '{rest[0]}'."
    if rest == ("type",):
        if fault.kind == "type_unknown":
            return "Question type must be noul, choice, or score."
        return f"question '{question_id}' type must be a non-empty string."
    if rest == ("instructions",):
        if fault.kind == "missing" or fault.value is None or _is_text_object_or_array(fault.value):
            return BLANK_INSTRUCTIONS
        return "instructions must be text, an object, an array, or null."
    if rest == ("criteria",):
        return _criteria_message(question, fault)
    kind = question.get("type")
    if kind == "noul":
        if fault.kind == "extra_forbidden":
            return f"Unknown noul criteria field '{rest[-1]}'."
        return f"criteria.{rest[-1]} must be text, an object, an array, or null."
    if kind == "choice":
        return "choice description must be text, an object, an array, or null."
    return "Score criteria entries must be non-empty text, objects, or arrays."


def _images_message(rest: tuple[Any, ...], fault: Fault) -> str:
    if not rest:
        return "A request accepts at most 4 images." if fault.kind == "too_long" else "images must be an array."
    where = f"images[{rest[0]}]"
    if len(rest) == 1:
        if isinstance(fault.value, str):
            return f"{where} must be a base64 data URL."
        return f"{where} must be a data URL string or an object."
    if fault.kind == "extra_forbidden":
        return f"Unknown {where} field '{rest[-1]}'."
    if rest[-1] == "content_type" and isinstance(fault.value, str):
        return f"{where} content_type must be image/png, image/jpeg, or image/webp."
    return f"{where} needs string content_type and base64 fields."


def _message(fault: Fault, data: dict[str, Any]) -> str:
    head, rest = fault.path[0], fault.path[1:]
    if head == "model":
        return "model must be a non-empty string."
    if head == "state":
        return "state must be text, an object, or an array."
    if head == "questions":
        if not rest:
            return "questions must be a non-empty map."
        if _is_option_name(fault, data):
            return choice_options_message(MAX_CHOICES)
        return _question_message(str(rest[0]), data["questions"][rest[0]], rest[1:], fault)
    if head in REFUSED_FIELDS:
        return f"{head} is not part of this API; use /v1/decisions for it."
    if head == "video":
        return "video is not supported on this backend; send images instead."
    if head == "chat_template_kwargs":
        if fault.kind == "extra_forbidden":
            return f"Unknown chat_template_kwargs field '{rest[-1]}'."
        return "Decisions require enable_thinking=false." if rest else "chat_template_kwargs must be an object."
    if head == "images":
        return _images_message(rest, fault)
    return INVALID_REQUEST_MESSAGE


def schema_error(exc: pydantic.ValidationError, data: Any) -> ApiError:
    """The route's message for the first of the generated model's errors in the route's order."""
    found = [expanded for fault in faults(exc, data) for expanded in _expand(fault, data)]
    found = with_lengths(found, data, lambda path: _bounds(path, data))
    return refuse(_message(min(found, key=lambda f: _check_order(f, data)), data))


SYSTEMONE_RULES = RouteRules(
    bad_json=_bad_json,
    not_object=_not_object,
    before_model=refuse_numeric_thinking,
    schema_error=schema_error,
    # The refused extensions are in the schema as null-only fields; chat_template_kwargs can only
    # say enable_thinking=false, which is what the scorer does anyway.
    handled=frozenset({"model", "state", "questions", "images", "chat_template_kwargs", "video", "x_debias",
                       "x_calibration",
                       *REFUSED_FIELDS}),
)
