"""What each kind of model can be asked to do, checked in one place for every route and command.

`require(model, task, name)` refuses an installed model that cannot do `task`, in the words its
callers have always used; `name` is what the client asked for (an alias or the id).
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from swama.engine.errors import WrongModel
from swama.engine.files.aliases import is_audio_model
from swama.engine.files.kinds import EMBEDDING, LANGUAGE, RERANKER, SPEECH_TO_TEXT, TEXT_TO_SPEECH, VISION

IMAGES_NEED_VISION = "Images are not supported by this model; it has no vision processor."


class Task(Enum):
    GENERATE = "generate"  # chat completions, responses, swama run
    DECIDE = "decide"  # decisions and System One, scored by a language or vision model
    RERANK = "rerank"  # /v1/rerank and /v2/rerank, through the decision scorer
    READ_IMAGES = "read images"  # a request that carries images
    EMBED = "embed"
    SPEAK = "speak"
    TRANSCRIBE = "transcribe"


class HasKind(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...


def _article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def _not_generative(model: HasKind) -> WrongModel:
    return WrongModel(f"Model '{model.id}' is {_article(model.kind)} {model.kind} model; this route needs a "
                      "language or vision model.")


def require(model: HasKind, task: Task, name: str | None = None) -> None:
    """Refuse `model` when it cannot do `task` (a 400 that says why)."""
    name = model.id if name is None else name
    if task is Task.GENERATE:
        if is_audio_model(name) or is_audio_model(model.id):
            raise WrongModel(f"Model '{name}' is an audio model; it cannot serve text generation.")
        if model.kind not in (LANGUAGE, VISION):
            raise _not_generative(model)
    elif task is Task.DECIDE:
        if model.kind not in (LANGUAGE, VISION):
            raise _not_generative(model)
    elif task is Task.RERANK:
        if model.kind not in (LANGUAGE, VISION, RERANKER):
            raise WrongModel(f"Model '{model.id}' cannot rerank: it is {_article(model.kind)} {model.kind} model, and "
                             "documents are ranked by a reranker (a cross-encoder) or by a language or vision model through the "
                             "decision scorer.",
                             param="model")
    elif task is Task.READ_IMAGES:
        if model.kind != VISION:
            raise WrongModel(IMAGES_NEED_VISION, code="invalid_image")
    elif task is Task.EMBED:
        if is_audio_model(name) or model.kind != EMBEDDING:
            raise WrongModel(f"Model '{model.id}' is {_article(model.kind)} {model.kind} model; /v1/embeddings "
                             "needs an embedding model (for example: swama pull minilm).",
                             code="model_not_supported", param="model")
    elif task is Task.SPEAK:
        if model.kind != TEXT_TO_SPEECH:
            raise WrongModel(f"Model '{name}' is not supported for TTS", code="invalid_value", param="model")
    elif task is Task.TRANSCRIBE:
        if model.kind != SPEECH_TO_TEXT:
            raise WrongModel(f"Model '{name}' is not a supported audio model")
