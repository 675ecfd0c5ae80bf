"""Cross-encoder rerankers (engine/kinds/cross_encoders.py) against transformers' own forward of the same
folder: tiny random BERT and XLM-RoBERTa sequence classifiers, written by transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from precision import F32_TINY_PROBABILITY

from swama.engine.errors import ContextTooLong, LoadFailed
from swama.engine.files.kinds import RERANKER, kind_of
from swama.engine.kinds.cross_encoders import score_pairs
from swama.engine.model import LoadedModel
from swama.engine.serving.loaders import load_model

QUERY = "What do bees make?"
DOCUMENTS = ["Bees make honey from the nectar of flowers.", "A week has seven days.", "Paris is in France.",
             "honey " * 600]  # the last is cut to the model's window


@pytest.fixture(scope="module")
def reranker(tiny_cross_encoder_dir: Path) -> LoadedModel:
    return load_model("test/tiny-reranker", tiny_cross_encoder_dir)


def _transformers_scores(folder: Path, query: str, documents: list[str]) -> list[float]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    config = json.loads((folder / "config.json").read_text())
    window = config["max_position_embeddings"] - (2 if config["model_type"] == "xlm-roberta" else 0)
    batch = tokenizer([query] * len(documents), documents, padding=True, truncation="only_second",
                      max_length=window, return_tensors="pt")
    if config["model_type"] == "xlm-roberta":
        batch.pop("token_type_ids", None)
    with torch.no_grad():
        return torch.sigmoid(model(**batch).logits[:, 0]).tolist()


def test_a_sequence_classifier_is_a_reranker_and_scores_as_transformers_does(reranker: LoadedModel,
                                                                            tiny_cross_encoder_dir: Path) -> None:
    assert kind_of(tiny_cross_encoder_dir) == RERANKER and reranker.kind == RERANKER
    got = score_pairs(reranker, QUERY, DOCUMENTS)
    want = _transformers_scores(tiny_cross_encoder_dir, QUERY, DOCUMENTS)
    # Another library and BLAS: float32 sums in another order. A sigmoid moves by at most a quarter of its
    # logit's move, so F32_TINY_LOGIT / 2 holds for logits under 32.
    assert max(abs(a - b) for a, b in zip(got.scores, want, strict=True)) < F32_TINY_PROBABILITY, (got.scores, want)
    assert max(got.scores) - min(got.scores) > 0.01  # the random head spreads the scores
    assert got.input_tokens > 500  # the long document read up to the window
    # Alone or beside others (other batches, other padding), a pair scores the same.
    alone = score_pairs(reranker, QUERY, DOCUMENTS[1:2])
    assert abs(alone.scores[0] - got.scores[1]) < F32_TINY_PROBABILITY


def test_documents_cut_to_max_tokens_per_doc_and_a_query_past_the_window(reranker: LoadedModel) -> None:
    cut = score_pairs(reranker, QUERY, [DOCUMENTS[3]], max_tokens_per_doc=4)
    same = score_pairs(reranker, QUERY, ["honey honey honey honey"])
    # The same ids in the same shape (one row, no padding): the same computation, to the bit.
    assert cut.scores[0] == same.scores[0] and cut.input_tokens < 20
    with pytest.raises(ContextTooLong, match="reads at most"):
        score_pairs(reranker, "bees " * 600, ["x"])


def test_a_classifier_of_several_labels_is_refused(tiny_cross_encoder_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "two-labels"
    shutil.copytree(tiny_cross_encoder_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "id2label": {"0": "a", "1": "b"}}))
    with pytest.raises(LoadFailed, match="several labels"):
        load_model("test/two-labels", folder)
