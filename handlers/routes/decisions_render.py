"""POST /v1/decisions: the byte-exact response body, each answer checked before it is rendered."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from swama.engine.client import Applied, DecisionError, ScoredAnswer
from swama.generated.decisions_models import (
    DecisionChoiceQuestion,
    DecisionPredicateQuestion,
)
from swama.handlers.routes.decision_rules import adjustment_json, answer_is_sound
from swama.handlers.routes.decisions_wording import Question

INVALID_ANSWER = "The model returned an invalid decision answer."
INVALID_CHOICE_ANSWER = "The model returned an invalid choice answer."
INVALID_SCORE_ANSWER = "The model returned an invalid score answer."


def _answer_json(question: Question, answer: ScoredAnswer, applied: Applied | None = None) -> dict[str, Any]:
    probabilities = [float(p) for p in answer.probabilities]
    adjusted = adjustment_json(applied)
    if isinstance(question, DecisionPredicateQuestion):
        if not answer_is_sound(answer, "yes_no", 2):
            raise DecisionError(500, INVALID_ANSWER)
        return {"type": "predicate", "name": question.name, "probability": probabilities[0], **adjusted}
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
            **adjusted,
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
        **adjusted,
    }


LABEL_MASS_HEADER = "X-Swama-Label-Mass"


def label_masses(answers: Sequence[ScoredAnswer]) -> str:
    """Comma-separated label masses in answer order ("null" where the model reports none)."""
    return ",".join("null" if a.mass is None else repr(float(a.mass)) for a in answers)


def render_decision_response(
    model: str, answers: Sequence[tuple[Question, ScoredAnswer]], input_tokens: int,
    applied: Sequence[Applied | None] = (),
) -> bytes:
    """The response body: answers in question order, ``name`` null when absent, typed values;
    `x_adjustment` on the answers whose question asked for debiasing or calibration."""
    body = {
        "model": model,
        "answers": [_answer_json(question, answer, applied[i] if i < len(applied) else None)
                    for i, (question, answer) in enumerate(answers)],
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens,
        },
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
