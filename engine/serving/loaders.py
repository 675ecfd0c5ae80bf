"""The loaders by model kind: the pool loads any installed model through this registry.

Each kind's loader lives with the kind and is imported only when a model of that kind loads, so
serving a language model never imports mlx-audio or mlx-embeddings, and no kind module is imported
by the model type they all share (engine/model.py).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from swama.engine.files.kinds import (
    DECISION,
    EMBEDDING,
    LANGUAGE,
    RERANKER,
    SPEECH_TO_TEXT,
    TEXT_TO_SPEECH,
    VISION,
    kind_of,
)
from swama.engine.model import LoadedModel

LOADERS = {
    LANGUAGE: "swama.engine.text.language:load_language_model",
    VISION: "swama.engine.kinds.vision:load_vision_language_model",
    DECISION: "swama.engine.decisions.checkpoints:load_decision_checkpoint",
    EMBEDDING: "swama.engine.kinds.embeddings:load_embedding_model",
    RERANKER: "swama.engine.kinds.cross_encoders:load_cross_encoder",
    SPEECH_TO_TEXT: "swama.engine.kinds.transcription:load_speech_to_text_model",
    TEXT_TO_SPEECH: "swama.engine.kinds.speech:load_text_to_speech_model",
}


def load_model(model_id: str, path: Path) -> LoadedModel:
    """Load the model in `path` with the library its kind needs."""
    module, function = LOADERS[kind_of(path)].split(":")
    return getattr(importlib.import_module(module), function)(model_id, path)
