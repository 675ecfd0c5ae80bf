"""A loaded model: weights, tokenizer and what the engine needs to know about them.

Language models load through mlx-lm, vision-language models through mlx-vlm; both present the same
face to the generator and the scorer: `network()` is a callable in mlx-lm's shape (token ids and a
cache in, logits out) and `tokenizer` is mlx-lm's tokenizer wrapper. A vision model adds `vision`,
its processor and image encoder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swama.engine.kinds import (
    DECISION,
    EMBEDDING,
    LANGUAGE,
    SPEECH_TO_TEXT,
    TEXT_TO_SPEECH,
    VISION,
    kind_of,
)
from swama.engine.runtime import compute_dtype


@dataclass
class LoadedModel:
    id: str
    path: Path
    model: Any  # mlx.nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper
    config: dict[str, Any]
    eos_ids: set[int]
    caches: dict[str, Any] = field(default_factory=dict)  # per-model scratch: prompt cache, label sets
    kind: str = LANGUAGE
    vision: Any = None  # VisionSupport, for vision-language models
    checkpoint: Any = None  # DecisionCheckpoint, for decision checkpoints (their own decision head)

    def network(self) -> Any:
        """The model to run one request on. A vision model's language model keeps positional
        state between calls, so every request gets its own view of it."""
        return self.vision.view() if self.vision is not None else self.model

    def close(self) -> None:
        """Stop what serves this model (its batch scheduler's thread) before it is dropped."""
        for value in self.caches.values():
            close = getattr(value, "close", None)
            if callable(close):
                close()

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "has_chat_template", False))

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size") or len(self.tokenizer.get_vocab()))


def _eos_ids(path: Path, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        try:
            value = json.loads((path / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    ids.update(getattr(tokenizer, "eos_token_ids", None) or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def cast_for_device(model: Any) -> None:
    """Floating weights are cast to the device's compute dtype (float32 on the CPU, bfloat16 on a GPU)."""
    import mlx.core as mx

    model.set_dtype(compute_dtype())
    mx.eval(model.parameters())


def load_language_model(model_id: str, path: Path) -> LoadedModel:
    from mlx_lm import load

    model, tokenizer = load(str(path))
    cast_for_device(model)
    config = json.loads((path / "config.json").read_text())
    return LoadedModel(model_id, path, model, tokenizer, config, _eos_ids(path, tokenizer))


def load_vision_language_model(model_id: str, path: Path) -> LoadedModel:
    """mlx-vlm's model and processor; the tokenizer is mlx-lm's wrapper over the same files, so
    text is encoded, rendered and detokenized exactly as for a language model."""
    from mlx_lm.utils import load_tokenizer

    from swama.engine.kinds.vision import VisionSupport, load_vision_model

    model, processor = load_vision_model(path)
    cast_for_device(model)
    tokenizer = load_tokenizer(path)
    config = json.loads((path / "config.json").read_text())
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    merged = {**text_config, **{k: v for k, v in config.items() if k != "text_config"}}
    return LoadedModel(model_id, path, model, tokenizer, merged, _eos_ids(path, tokenizer), kind=VISION,
                       vision=VisionSupport(model, processor))


def load_decision_checkpoint(model_id: str, path: Path) -> LoadedModel:
    """A Clef or PPLX-Decider checkpoint through mlx-vlm; it answers only decisions."""
    from mlx_lm.utils import load_tokenizer

    from swama.engine.decisions.checkpoints import load_checkpoint

    checkpoint = load_checkpoint(path)
    cast_for_device(checkpoint.model)
    tokenizer = load_tokenizer(path)
    config = json.loads((path / "config.json").read_text())
    return LoadedModel(model_id, path, checkpoint.model, tokenizer, config, _eos_ids(path, tokenizer),
                       kind=DECISION, checkpoint=checkpoint)


def load_model(model_id: str, path: Path) -> LoadedModel:
    """Load the model in `path` with the library its kind needs."""
    kind = kind_of(path)
    if kind == VISION:
        return load_vision_language_model(model_id, path)
    if kind == DECISION:
        return load_decision_checkpoint(model_id, path)
    if kind == EMBEDDING:
        from swama.engine.kinds.embeddings import load_embedding_model

        return load_embedding_model(model_id, path)
    if kind == SPEECH_TO_TEXT:
        from swama.engine.kinds.transcription import load_speech_to_text_model

        return load_speech_to_text_model(model_id, path)
    if kind == TEXT_TO_SPEECH:
        from swama.engine.kinds.speech import load_text_to_speech_model

        return load_text_to_speech_model(model_id, path)
    return load_language_model(model_id, path)
