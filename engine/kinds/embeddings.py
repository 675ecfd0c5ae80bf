"""Embedding models through mlx-embeddings: tokenize, batch by length, pool, normalise, truncate.

Each architecture in mlx-embeddings pools in its own way (mean pooling for BERT-style encoders and
EmbeddingGemma, last-token pooling for Qwen3-Embedding) and L2-normalises; padding is masked, so a
text's vector does not depend on the batch it ran in. `dimensions` keeps the first N components
and normalises again, which is only meaningful for models trained for it (Matryoshka models).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from swama.engine.errors import BadInput, Cancelled, ContextTooLong
from swama.engine.files.kinds import EMBEDDING
from swama.engine.model import LoadedModel, cast_for_device

# Architectures whose embeddings were trained to be truncated (Matryoshka representation learning):
# EmbeddingGemma (gemma3_text) and Qwen3-Embedding (qwen3).
MATRYOSHKA_TYPES = frozenset({"gemma3_text", "qwen3"})
# A batch holds at most this many tokens (rows x longest row) and this many rows, and its longest
# text is at most PAD_SLACK times its shortest plus PAD_TOKENS: on the CPU a padded token costs as
# much as a real one, so little padding beats big batches.
BATCH_TOKENS = 8192
BATCH_ROWS = 64
PAD_SLACK, PAD_TOKENS = 1.25, 8


@dataclass(frozen=True)
class EmbeddingSpec:
    dimensions: int  # the length of the vectors the model returns
    max_tokens: int  # the longest input it takes, special tokens included
    matryoshka: bool  # whether shorter `dimensions` are meaningful
    pad_id: int


@dataclass
class Embeddings:
    vectors: np.ndarray  # (n, dimensions) float32, each row of unit length
    prompt_tokens: int


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _spec(path: Path, config: dict[str, Any], model: Any, tokenizer: Any) -> EmbeddingSpec:
    # sentence-transformers states the input length the model was trained for; it is often shorter
    # than the position table (256 of 512 for all-MiniLM-L6-v2).
    limits = [_read_json(path / "sentence_bert_config.json").get("max_seq_length"),
              config.get("max_position_embeddings")]
    max_tokens = min(int(v) for v in limits if isinstance(v, int) and v > 0) if any(
        isinstance(v, int) and v > 0 for v in limits) else 512
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    import mlx.core as mx

    probe = model(mx.array([[pad_id]]), attention_mask=mx.array([[1]])).text_embeds
    return EmbeddingSpec(dimensions=int(probe.shape[-1]), max_tokens=max_tokens,
                         matryoshka=str(config.get("model_type", "")) in MATRYOSHKA_TYPES, pad_id=int(pad_id))


def load_embedding_model(model_id: str, path: Path) -> LoadedModel:
    from mlx_embeddings.utils import load

    model, wrapper = load(str(path))
    cast_for_device(model)
    tokenizer = getattr(wrapper, "_tokenizer", wrapper)  # the Hugging Face tokenizer inside the wrapper
    config = _read_json(path / "config.json")
    loaded = LoadedModel(model_id, path, model, tokenizer, config, set(), kind=EMBEDDING)
    loaded.beside.set(EmbeddingSpec, _spec(path, config, model, tokenizer))
    return loaded


def spec_of(model: LoadedModel) -> EmbeddingSpec:
    spec = model.beside.get(EmbeddingSpec)
    assert spec is not None, f"{model.id} is not an embedding model"
    return spec


def check_dimensions(model_id: str, spec: EmbeddingSpec, dimensions: int | None) -> None:
    """Refuse a `dimensions` the model cannot honour (before any work is done)."""
    if dimensions is None or dimensions == spec.dimensions:
        return
    if not spec.matryoshka:
        raise BadInput(f"Model '{model_id}' returns {spec.dimensions}-dimensional embeddings and was not trained "
                       f"for shorter ones; omit 'dimensions' or send {spec.dimensions}.", code="invalid_dimensions",
                       param="dimensions")
    if dimensions > spec.dimensions:
        raise BadInput(f"'dimensions' must be at most {spec.dimensions} for model '{model_id}'.",
                       code="invalid_dimensions", param="dimensions")


def tokenize(model: LoadedModel, texts: list[str]) -> list[list[int]]:
    """Token ids of each text with the model's special tokens; refuses texts longer than it takes."""
    spec = spec_of(model)
    ids = [list(model.tokenizer(text, add_special_tokens=True)["input_ids"]) for text in texts]
    for index, row in enumerate(ids):
        if len(row) > spec.max_tokens:
            where = f"Input {index}" if len(texts) > 1 else "The input"
            raise ContextTooLong(f"{where} is {len(row)} tokens long; model '{model.id}' takes at most "
                                 f"{spec.max_tokens} tokens per input.", param="input")
    return ids


def batches(lengths: list[int], max_tokens: int = BATCH_TOKENS, max_rows: int = BATCH_ROWS) -> list[list[int]]:
    """Indices grouped into batches of similar length (shortest first), so little padding is computed."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for index in order:
        if groups:
            group = groups[-1]
            longest, shortest = lengths[index], lengths[group[0]]  # sorted: the newcomer is the longest
            if (len(group) < max_rows and (len(group) + 1) * longest <= max_tokens
                    and longest <= shortest * PAD_SLACK + PAD_TOKENS):
                group.append(index)
                continue
        groups.append([index])
    return groups


def embed(model: LoadedModel, ids: list[list[int]], dimensions: int | None = None,
          cancel: threading.Event | None = None) -> Embeddings:
    """Unit-length embeddings of tokenized texts, in input order."""
    import mlx.core as mx

    spec = spec_of(model)
    out = np.empty((len(ids), spec.dimensions), dtype=np.float32)
    for group in batches([len(row) for row in ids]):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        width = max(len(ids[i]) for i in group)
        tokens = np.full((len(group), width), spec.pad_id, dtype=np.int32)
        mask = np.zeros((len(group), width), dtype=np.int32)
        for row, index in enumerate(group):
            tokens[row, : len(ids[index])] = ids[index]
            mask[row, : len(ids[index])] = 1
        vectors = model.model(mx.array(tokens), attention_mask=mx.array(mask)).text_embeds
        out[group] = np.array(vectors.astype(mx.float32))
    if dimensions is not None and dimensions < spec.dimensions:
        out = out[:, :dimensions]
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return Embeddings(np.ascontiguousarray(out), sum(len(row) for row in ids))
