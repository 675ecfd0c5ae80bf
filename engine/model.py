"""A loaded model: weights, tokenizer and the plain facts the engine needs to know about them.

Language models load through mlx-lm, vision-language models through mlx-vlm; both present the same
face to the generator and the scorer: `tokenizer` is mlx-lm's tokenizer wrapper, and
kinds/vision.py's `network(model)` is a callable in mlx-lm's shape (token ids and a cache in, logits
out). Each kind's loader lives with the kind (serving/loaders.py lists them); this module imports none
of them.

What a layer keeps per model (a vision model's processor, the scorer's label tokens, the batch
scheduler) is kept in `beside`, keyed by that layer's own type and read through that layer's
accessor (`vision_of(model)`, `decision_state(model)`), so this module names no higher layer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from swama.engine.files.kinds import LANGUAGE
from swama.engine.runtime import compute_dtype

T = TypeVar("T")


class Beside:
    """Values the layers above keep beside one loaded model, at most one per type: the type is the
    key, and the module that defines it is the only one that sets or reads it.

    Values are set at load, on the event loop or lazily on worker threads. Each call is one step on
    a dict (atomic under the GIL); two threads that first ask `setdefault` at once may both make a
    value, and both get the one stored first."""

    def __init__(self) -> None:
        self._values: dict[type, Any] = {}

    def get(self, key: type[T]) -> T | None:
        return self._values.get(key)

    def set(self, key: type[T], value: T | None) -> None:
        """Keep `value` under `key`; None keeps none."""
        if value is None:
            self._values.pop(key, None)
        else:
            assert isinstance(value, key), (key, value)
            self._values[key] = value

    def setdefault(self, key: type[T], make: Callable[[], T]) -> T:
        """The value under `key`, made by `make` the first time."""
        value = self._values.get(key)
        return value if value is not None else self._values.setdefault(key, make())

    def close(self) -> None:
        """Close every value that can be closed (a batch scheduler stops its thread)."""
        for value in list(self._values.values()):
            close = getattr(value, "close", None)
            if callable(close):
                close()


@dataclass
class LoadedModel:
    id: str
    path: Path
    model: Any  # mlx.nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper (the Hugging Face tokenizer for embedding models)
    config: dict[str, Any]
    eos_ids: set[int]
    kind: str = LANGUAGE
    beside: Beside = field(default_factory=Beside)

    def close(self) -> None:
        """Stop what runs beside this model (its batch scheduler's thread) before it is dropped."""
        self.beside.close()

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "has_chat_template", False))

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size") or len(self.tokenizer.get_vocab()))


def eos_ids_of(path: Path, tokenizer: Any) -> set[int]:
    """Every end-of-sequence token the model folder and its tokenizer name."""
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


def truncated(tokenizer: Any, documents: Sequence[str], max_tokens: int) -> list[str]:
    """Each document cut to its first `max_tokens` tokens (as `tokenizer` splits it alone)."""
    out = []
    for document in documents:
        ids = tokenizer.encode(document, add_special_tokens=False)
        out.append(document if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]))
    return out
