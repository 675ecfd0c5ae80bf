"""Cross-encoder rerankers (model kind "reranker"): a BERT-family encoder reading the query and a
document as one pair, with a one-logit classifier on top, as sentence-transformers' CrossEncoder and
transformers' `*ForSequenceClassification` run them (ms-marco MiniLM, bge-reranker).

The encoder bodies are mlx-embeddings' own (BERT, XLM-RoBERTa); the heads are the two transformers
uses for one label:
- BERT (`BertForSequenceClassification`): `classifier` on the pooler (dense and tanh over [CLS]);
- XLM-RoBERTa (`XLMRobertaForSequenceClassification`): `classifier.dense`, tanh, `classifier.out_proj`
  over <s>, without the body's pooler.
The relevance score is the sigmoid of the logit, in [0, 1]. Pairs are encoded by the model's own
tokenizer (`[CLS] query [SEP] document [SEP]`, token types 0 then 1 for BERT), documents cut to fit
the model's window (the query is kept whole), sorted by length and batched with the padding masked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from swama.engine.errors import BadInput, Cancelled, ContextTooLong, LoadFailed
from swama.engine.files.kinds import RERANKER
from swama.engine.kinds.embeddings import batches
from swama.engine.model import LoadedModel, cast_for_device, truncated

HEADS = {"BertForSequenceClassification": "bert", "XLMRobertaForSequenceClassification": "xlm-roberta"}


@dataclass(frozen=True)
class CrossEncoderSpec:
    body: str  # "bert" or "xlm-roberta"
    max_tokens: int  # the model's window: query and document together
    pad_id: int


@dataclass(frozen=True)
class PairScores:
    scores: list[float]  # per document, in request order
    input_tokens: int


def _network(config: dict[str, Any], body: str) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    if body == "bert":
        from mlx_embeddings.models import bert as module

        args = module.ModelArgs.from_dict(config)
    else:
        from mlx_embeddings.models import xlm_roberta as module

        args = module.ModelArgs.from_dict({**config, "add_pooling_layer": False})
    hidden = int(config["hidden_size"])

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if body == "xlm-roberta":
                self.dense = nn.Linear(hidden, hidden)
                self.out_proj = nn.Linear(hidden, 1)
            else:
                self.linear = nn.Linear(hidden, 1)

        def __call__(self, output: Any) -> Any:
            if body == "xlm-roberta":
                return self.out_proj(mx.tanh(self.dense(output.last_hidden_state[:, 0])))
            return self.linear(output.pooler_output)

    class CrossEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = module.Model(args)
            self.classifier = Classifier()

        def __call__(self, ids: Any, types: Any, mask: Any) -> Any:
            if body == "bert":
                output = self.encoder(ids, token_type_ids=types, attention_mask=mask)
            else:
                output = self.encoder(ids, attention_mask=mask)
            return self.classifier(output)[:, 0]

    return CrossEncoder()


def _weights(path: Path, body: str) -> list[tuple[str, Any]]:
    """transformers' names -> ours: the body's prefix goes, BERT's classifier becomes `linear`."""
    import mlx.core as mx

    prefix = "bert." if body == "bert" else "roberta."
    out = []
    for file in sorted(path.glob("*.safetensors")):
        for name, value in mx.load(str(file)).items():
            if "position_ids" in name:
                continue
            if name.startswith(prefix):
                out.append(("encoder." + name[len(prefix):], value))
            elif body == "bert" and name.startswith("classifier."):
                out.append(("classifier.linear." + name[len("classifier."):], value))
            elif name.startswith("classifier."):
                out.append((name, value))
    return out


def load_cross_encoder(model_id: str, path: Path) -> LoadedModel:
    from transformers import AutoTokenizer

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    body = next((HEADS[a] for a in config.get("architectures") or [] if a in HEADS), None)
    if body is None:
        raise LoadFailed(f"Model '{model_id}' is a sequence classifier swama cannot run: it runs "
                         f"{', '.join(HEADS)}, not {config.get('architectures')}.")
    if int(config.get("num_labels", len(config.get("id2label") or {0: 0}))) != 1:
        raise LoadFailed(f"Model '{model_id}' classifies into several labels; a reranker has one relevance logit.")
    network = _network(config, body)
    try:
        network.load_weights(_weights(path, body), strict=True)
    except ValueError as exc:
        raise LoadFailed(f"Model '{model_id}': its weights do not fit its config: {exc}") from None
    network.eval()  # MLX modules start in training mode: the body's dropout would be on
    cast_for_device(network)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    window = int(config.get("max_position_embeddings", 512)) - (2 if body == "xlm-roberta" else 0)
    max_tokens = min(window, int(getattr(tokenizer, "model_max_length", window) or window))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    loaded = LoadedModel(model_id, path, network, tokenizer, config, set(), kind=RERANKER)
    loaded.beside.set(CrossEncoderSpec, CrossEncoderSpec(body, max_tokens, int(pad_id)))
    return loaded


def encode_pairs(model: LoadedModel, query: str, documents: Sequence[str],
                 max_tokens_per_doc: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(token ids, token types) of each (query, document) pair, documents cut to fit the window."""
    spec = model.beside.get(CrossEncoderSpec)
    assert spec is not None, f"{model.id} is not a cross-encoder"
    tokenizer = model.tokenizer
    alone = tokenizer(query, "", add_special_tokens=True)["input_ids"]
    if len(alone) >= spec.max_tokens:
        raise ContextTooLong(f"The query is {len(alone)} tokens long; model '{model.id}' reads at most "
                             f"{spec.max_tokens} tokens of query and document together.", param="query")
    if max_tokens_per_doc is not None:
        documents = truncated(tokenizer, documents, max_tokens_per_doc)
    pairs = []
    for document in documents:
        encoded = tokenizer(query, document, truncation="only_second", max_length=spec.max_tokens)
        ids = list(encoded["input_ids"])
        types = list(encoded.get("token_type_ids") or [0] * len(ids))
        pairs.append((ids, types))
    return pairs


def score_pairs(model: LoadedModel, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None,
                cancel: threading.Event | None = None) -> PairScores:
    """Each document's relevance to `query`: sigmoid of the cross-encoder's logit, in request order."""
    import mlx.core as mx

    if not documents:
        raise BadInput("No documents to rank.", param="documents")
    spec = model.beside.get(CrossEncoderSpec)
    assert spec is not None
    pairs = encode_pairs(model, query, documents, max_tokens_per_doc)
    scores = np.empty(len(pairs), dtype=np.float64)
    for group in batches([len(ids) for ids, _ in pairs]):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        width = max(len(pairs[i][0]) for i in group)
        ids = np.full((len(group), width), spec.pad_id, dtype=np.int32)
        types = np.zeros((len(group), width), dtype=np.int32)
        mask = np.zeros((len(group), width), dtype=np.int32)
        for row, index in enumerate(group):
            tokens, kinds = pairs[index]
            ids[row, : len(tokens)], types[row, : len(tokens)], mask[row, : len(tokens)] = tokens, kinds, 1
        logits = model.model(mx.array(ids), mx.array(types), mx.array(mask))
        scores[group] = np.array(mx.sigmoid(logits.astype(mx.float32)))
    return PairScores([float(s) for s in scores], sum(len(ids) for ids, _ in pairs))
