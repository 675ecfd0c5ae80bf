"""A loaded model: weights, tokenizer, what the engine needs to know about them, and the state the
engine keeps beside them.

Language models load through mlx-lm, vision-language models through mlx-vlm; both present the same
face to the generator and the scorer: `network()` is a callable in mlx-lm's shape (token ids and a
cache in, logits out) and `tokenizer` is mlx-lm's tokenizer wrapper. A vision model adds `vision`,
its processor and image encoder. Each kind's loader lives with the kind (serving/loaders.py lists
them); this module imports none of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swama.engine.kinds import LANGUAGE
from swama.engine.runtime import compute_dtype

if TYPE_CHECKING:  # each field's owner; imported for the annotations only
    from swama.engine.decisions.checkpoints import DecisionCheckpoint
    from swama.engine.decisions.decide import DecisionState
    from swama.engine.kinds.embeddings import EmbeddingSpec
    from swama.engine.kinds.vision import VisionSupport
    from swama.engine.ranks.group import RankGroup
    from swama.engine.serving.prompt_cache import PromptCache
    from swama.engine.serving.scheduler import Scheduler
    from swama.engine.text.grammar import Grammars
    from swama.engine.text.logprobs import TokenBytes
    from swama.engine.text.reasoning import ThinkMarkers


@dataclass
class ModelState:
    """What the engine keeps beside a loaded model's weights, each field set by the module named."""

    scheduler: Scheduler | None = None  # serving/engine.py: the thread that runs a language model's work
    prompt_cache: PromptCache | None = None  # serving/engine.py; None where the model keeps none
    native_tools: bool | None = None  # text/generator.py: whether the chat template renders tools itself
    decisions: DecisionState | None = None  # decisions/decide.py: label tokens, openers, head split, bounds
    token_bytes: TokenBytes | None = None  # text/logprobs.py: each token's bytes, for log probabilities
    grammars: Grammars | None = None  # text/grammar.py: structured-output grammars compiled for this model
    think_markers: ThinkMarkers | bool | None = None  # text/reasoning.py: the markers, False: it does not think


@dataclass
class LoadedModel:
    id: str
    path: Path
    model: Any  # mlx.nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper (the Hugging Face tokenizer for embedding models)
    config: dict[str, Any]
    eos_ids: set[int]
    kind: str = LANGUAGE
    vision: VisionSupport | None = None  # vision-language models: processor and image encoder
    checkpoint: DecisionCheckpoint | None = None  # decision checkpoints: their own decision head
    embedding: EmbeddingSpec | None = None  # embedding models: width, longest input, padding
    group: RankGroup | None = None  # a model split across ranks: the group holding the other shards
    state: ModelState = field(default_factory=ModelState)

    def network(self) -> Any:
        """The model to run one request on. A vision model's language model keeps positional
        state between calls, so every request gets its own view of it."""
        return self.vision.view() if self.vision is not None else self.model

    def close(self) -> None:
        """Stop what serves this model (its batch scheduler's thread) before it is dropped."""
        if self.state.scheduler is not None:
            self.state.scheduler.close()

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
