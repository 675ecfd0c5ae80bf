"""The decision routes' generated request models are what refuse unknown fields, wrong types and
missing fields; each route's mapper only words the model's error."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from swama.generated.decisions_models import (
    DecisionChoiceQuestion,
    DecisionCreateRequest,
    DecisionScoreQuestion,
)
from swama.generated.routes import OPERATIONS
from swama.generated.systemone_models import SystemOneChoiceQuestion, SystemOneScoreQuestion
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import parse_json_request, rules_of
from swama.handlers.routes.decision_rules import (
    MAX_CHOICES,
    MAX_LEVELS,
    MAX_QUESTIONS,
    MIN_CHOICES,
    MIN_LEVELS,
    length_bounds,
)
from swama.handlers.routes.decisions import create_decision
from swama.handlers.routes.systemone import create_system_one

DECISION = {"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "Q"}]}
SYSTEMONE = {"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "Q"}}}


def _with(base: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(base))
    node = data
    for part in path[:-1]:
        node = node[part]
    if value is _DROP:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


_DROP = object()

CASES = [
    # (operation, handler, base, change at, new value, the error type pydantic reports, message)
    ("createDecision", create_decision, DECISION, ("zz",), 1, "extra_forbidden", "Unknown decision field 'zz'."),
    ("createDecision", create_decision, DECISION, ("questions", 0, "weight"), 1, "extra_forbidden",
     "Unknown decision field 'weight'."),
    ("createDecision", create_decision, DECISION, ("model",), 5, "string_type", "model must be a non-empty string."),
    ("createDecision", create_decision, DECISION, ("questions", 0, "instructions"), ["x"], "string_type",
     "questions[0] instructions must be a non-empty string."),
    ("createDecision", create_decision, DECISION, ("input",), _DROP, "missing",
     "input must be a string or an array of user messages."),
    ("createDecision", create_decision, DECISION, ("questions", 0, "instructions"), _DROP, "missing",
     "questions[0] instructions must be a non-empty string."),
    ("createSystemOne", create_system_one, SYSTEMONE, ("questions", "q", "zz"), 1, "extra_forbidden",
     "Unknown question 'q' field 'zz'."),
    ("createSystemOne", create_system_one, SYSTEMONE, ("chat_template_kwargs",), {"tools": []}, "extra_forbidden",
     "Unknown chat_template_kwargs field 'tools'."),
    ("createSystemOne", create_system_one, SYSTEMONE, ("state",), 1.5, "string_type",
     "state must be text, an object, or an array."),
    ("createSystemOne", create_system_one, SYSTEMONE, ("temperature",), 1, "none_required",
     "temperature is not part of this API; use /v1/decisions for it."),
    ("createSystemOne", create_system_one, SYSTEMONE, ("model",), _DROP, "missing",
     "model must be a non-empty string."),
    ("createSystemOne", create_system_one, SYSTEMONE, ("questions", "q", "instructions"), _DROP, "missing",
     "Non-empty instructions are required on this decision backend. Supported bounds: a choice needs at "
     "least two options; a score takes 2 to 10 levels."),
]


@pytest.mark.parametrize(("op", "handler", "base", "path", "value", "kind", "message"), CASES)
def test_the_generated_model_refuses(op: str, handler: Any, base: dict[str, Any], path: tuple[Any, ...],
                                     value: Any, kind: str, message: str) -> None:
    data = _with(base, path, value)
    model = OPERATIONS[op].request_model
    assert model is not None
    with pytest.raises(pydantic.ValidationError) as caught:
        model.model_validate(data)
    assert kind in {e["type"] for e in caught.value.errors()}
    rules = rules_of(handler)
    rules.before_model(data)  # no rule ahead of the model takes these
    assert rules.schema_error(caught.value, data).message == message
    with pytest.raises(ApiError) as refused:
        parse_json_request(OPERATIONS[op], rules, json.dumps(data).encode())
    assert (refused.value.status, refused.value.message) == (400, message)


def test_limits_in_messages_are_the_generated_models_limits() -> None:
    assert length_bounds(DecisionCreateRequest, "questions") == (1, MAX_QUESTIONS)
    assert length_bounds(DecisionChoiceQuestion, "choices") == (MIN_CHOICES, MAX_CHOICES)
    assert length_bounds(DecisionScoreQuestion, "levels") == (MIN_LEVELS, MAX_LEVELS)
    assert length_bounds(SystemOneChoiceQuestion, "criteria") == (MIN_CHOICES, MAX_CHOICES)
    assert length_bounds(SystemOneScoreQuestion, "criteria") == (MIN_LEVELS, MAX_LEVELS)


def test_unknown_system_one_top_level_fields_pass_the_model() -> None:
    # System One's contract allows them; the model ignores them, as the route always did.
    parsed = parse_json_request(OPERATIONS["createSystemOne"], rules_of(create_system_one),
                                json.dumps({**SYSTEMONE, "assets": [1]}).encode())
    assert "assets" not in parsed.model_dump()


@pytest.mark.parametrize(("op", "handler", "data", "message"), [
    ("createDecision", create_decision,
     {**DECISION, "questions": [{"type": "choice", "instructions": "Q", "choices": [{"value": 1}]}]},
     "questions[0] choices must contain 2–255 entries."),
    ("createSystemOne", create_system_one,
     {**SYSTEMONE, "questions": {"q": {"type": "score", "instructions": "Q", "criteria": [None]}}},
     "a score takes 2 to 10 levels on this backend."),
])
def test_a_length_comes_before_its_items(op: str, handler: Any, data: dict[str, Any], message: str) -> None:
    # pydantic leaves the length unjudged while an item is invalid; the routes judge it first.
    with pytest.raises(ApiError) as refused:
        parse_json_request(OPERATIONS[op], rules_of(handler), json.dumps(data).encode())
    assert refused.value.message == message


def test_non_blank_text_refuses_next_line() -> None:
    """U+0085 is whitespace to str.strip() but not to JSON Schema's \\s: the non-blank pattern names it,
    so the document refuses a label the handler would find blank (found by the contract test)."""
    from swama.generated.decisions_models import DecisionCreateRequest

    body = {"model": "m", "input": "x", "questions": [
        {"type": "score", "instructions": "Q", "levels": [{"label": "\u0085"}, {"label": "b"}]}]}
    with pytest.raises(pydantic.ValidationError):
        DecisionCreateRequest.model_validate(body)
    body["questions"][0]["levels"][0]["label"] = "a\u0085"
    DecisionCreateRequest.model_validate(body)
