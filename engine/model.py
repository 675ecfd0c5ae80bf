"""A loaded language model: weights, tokenizer and what the engine needs to know about them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def load_language_model(model_id: str, path: Path) -> LoadedModel:
    """Load with mlx-lm; on the CPU the weights are cast to float32, its fastest dtype there."""
    import mlx.core as mx
    from mlx_lm import load

    model, tokenizer = load(str(path))
    dtype = compute_dtype()
    if dtype is not None:
        model.set_dtype(dtype)
    mx.eval(model.parameters())
    config = json.loads((path / "config.json").read_text())
    return LoadedModel(model_id, path, model, tokenizer, config, _eos_ids(path, tokenizer))
