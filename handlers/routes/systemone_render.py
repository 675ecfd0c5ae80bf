"""POST /v1/systemone: the byte-exact response body, answers keyed by question id."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from swama.engine.client import Applied, DecisionError, ScoredAnswer
from swama.generated.systemone_models import (
    SystemOneChoiceQuestion,
    SystemOneNoulQuestion,
    SystemOneScoreQuestion,
)
from swama.handlers.routes.decision_rules import adjustment_json, answer_is_sound, plain
from swama.handlers.routes.systemone_wording import Question

INVALID_ANSWER = "The model returned an invalid SystemOne answer."

_KINDS = {SystemOneNoulQuestion: "yes_no", SystemOneChoiceQuestion: "choice", SystemOneScoreQuestion: "score"}


def _answer_json(question: Question, answer: ScoredAnswer, applied: Applied | None = None) -> dict[str, Any]:
    view_count = 2 if isinstance(question, SystemOneNoulQuestion) else len(question.criteria)
    if not answer_is_sound(answer, _KINDS[type(question)], view_count):  # type: ignore[arg-type]
        raise DecisionError(500, INVALID_ANSWER)
    probabilities = [float(p) for p in answer.probabilities]
    # A decision checkpoint's head scores only the answers: it has no label mass to report.
    mass = {} if answer.mass is None else {"x_label_mass": float(answer.mass)}
    mass |= adjustment_json(applied)
    if isinstance(question, SystemOneNoulQuestion):
        return {"type": "noul", "noul": probabilities[0], **mass}
    if isinstance(question, SystemOneChoiceQuestion):
        names = list(question.criteria)
        return {
            "type": "choice",
            "choice": names[answer.choice_index],
            "confidence": float(answer.confidence),  # type: ignore[arg-type]
            "probabilities": dict(zip(names, probabilities, strict=True)),
            **mass,
        }
    return {
        "type": "score",
        "score": float(answer.score),  # type: ignore[arg-type]
        "confidence": float(answer.confidence),  # type: ignore[arg-type]
        "legend": {str(i): plain(level) for i, level in enumerate(question.criteria)},
        "probabilities": {str(i): p for i, p in enumerate(probabilities)},
        **mass,
    }


def render_systemone_response(
    model: str, answers: Sequence[tuple[str, Question, ScoredAnswer]], input_tokens: int,
    applied: Sequence[Applied | None] = (),
) -> bytes:
    """The response body: answers keyed by question id in request order; no confidence on noul;
    `x_adjustment` on the answers whose question asked for debiasing or calibration."""
    body = {
        "model": model,
        "answers": {question_id: _answer_json(question, answer, applied[i] if i < len(applied) else None)
                    for i, (question_id, question, answer) in enumerate(answers)},
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
