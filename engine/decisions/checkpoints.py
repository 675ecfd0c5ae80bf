"""Decision checkpoints: models trained to answer typed questions through a head of their own.

Clef (mlx-vlm's `clef`: a joint schema head over Qwen3.5 that scores every question of a request from
one prompt in one prefill) and PPLX-Decider 2 (`decider2`: its own prompt, option codes and a
calibrated temperature) answer through mlx-vlm's own prediction code. Their heads score only the
answers, so there is no label mass; confidence follows the System One formulas, from the
probabilities the checkpoint gives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swama.engine.decisions.scorer import DecisionError, ScoredAnswer
from swama.engine.decisions.scorer.math import (
    choice_confidence,
    expected_score,
    first_argmax,
    score_confidence,
)
from swama.engine.files.kinds import DECISION
from swama.engine.model import LoadedModel, cast_for_device, eos_ids_of

IMAGES_NOT_READ = "This decision checkpoint reads text only; it does not take images."


@dataclass
class DecisionCheckpoint:
    model: Any  # the mlx-vlm model, with `predict`
    processor: Any

    @property
    def takes_images(self) -> bool:
        return "images" in getattr(self.model, "decision_media", ())


@dataclass(frozen=True)
class CheckpointResult:
    answers: list[ScoredAnswer]  # in question order
    input_tokens: int


def load_checkpoint(path: Any) -> DecisionCheckpoint:
    from mlx_vlm.utils import load

    model, processor = load(str(path))
    return DecisionCheckpoint(model, processor)


def predict(checkpoint: DecisionCheckpoint, state: Any, questions: Mapping[str, Mapping[str, Any]],
            images: Sequence[Any] = ()) -> CheckpointResult:
    """Answer System One questions (`{id: {type, instructions, criteria}}`, in request order) about
    `state` (text, or the JSON value itself) and `images` (PIL images)."""
    from mlx_vlm.decision import predict as library_predict

    if images and not checkpoint.takes_images:
        raise DecisionError(400, IMAGES_NOT_READ)
    media = {"images": [i.convert("RGB") for i in images]} if images else {}
    try:
        out = library_predict(checkpoint.model, checkpoint.processor, state, dict(questions), **media)
    except ValueError as exc:  # the checkpoint's own refusals (its supported types and bounds)
        raise DecisionError(400, str(exc)) from None
    answers = [_scored(question, out["answers"][qid]) for qid, question in questions.items()]
    return CheckpointResult(answers, int(out["usage"]["input_tokens"]))


def _scored(question: Mapping[str, Any], answer: Mapping[str, Any]) -> ScoredAnswer:
    kind = question["type"]
    if kind == "noul":
        p = float(answer["probability"])
        return ScoredAnswer("yes_no", (p, 1.0 - p), 0 if p >= 0.5 else 1, None, None, None)
    probabilities = tuple(float(v) for v in answer["probabilities"].values())  # as the checkpoint gives them
    if kind == "choice":
        return ScoredAnswer("choice", probabilities, first_argmax(probabilities), None,
                            choice_confidence(probabilities), None)
    return ScoredAnswer("score", probabilities, first_argmax(probabilities), expected_score(probabilities),
                        score_confidence(probabilities), None)


def load_decision_checkpoint(model_id: str, path: Path) -> LoadedModel:
    """A Clef or PPLX-Decider checkpoint through mlx-vlm; it answers only decisions."""
    from mlx_lm.utils import load_tokenizer

    checkpoint = load_checkpoint(path)
    cast_for_device(checkpoint.model)
    tokenizer = load_tokenizer(path)
    config = json.loads((path / "config.json").read_text())
    loaded = LoadedModel(model_id, path, checkpoint.model, tokenizer, config, eos_ids_of(path, tokenizer),
                         kind=DECISION)
    loaded.beside.set(DecisionCheckpoint, checkpoint)
    return loaded


def checkpoint_of(model: LoadedModel) -> DecisionCheckpoint:
    checkpoint = model.beside.get(DecisionCheckpoint)
    assert checkpoint is not None, f"{model.id} is not a decision checkpoint"
    return checkpoint
