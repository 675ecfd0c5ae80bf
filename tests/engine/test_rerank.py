"""Reranking through the decision scorer (engine/decisions/rerank.py): the decision prompt's job, and a
model card's own prompt (Qwen3-Reranker's) scored exactly as its card scores it."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from precision import F32_TINY_PROBABILITY

from swama.engine.decisions.decide import DecisionRun
from swama.engine.decisions.rerank import QWEN3_RERANKER, RerankJob, card_format, decision_job
from swama.engine.model import LoadedModel, truncated
from swama.engine.text.language import load_language_model

QUERY = "What do bees make?"
DOCUMENTS = ["Bees make honey from the nectar of flowers.", "A week has seven days.", "Paris is in France."]


@pytest.fixture(scope="module")
def qwen3(tiny_thinking_dir: Path) -> LoadedModel:
    """A tiny random Qwen3 with Qwen3's own tokenizer: the shape of Qwen3-Reranker."""
    return load_language_model("test/Qwen3-Reranker-tiny", tiny_thinking_dir)


def _run(model: LoadedModel, job) -> tuple[list[float], int]:
    run = DecisionRun(model, job)
    run.start()
    while not run.done:
        run.score_batch()
    result = run.result()
    return [a.p_yes for a in result.answers], result.shared_prefix_tokens


def test_a_card_format_is_told_by_the_models_name() -> None:
    assert card_format("me/Qwen3-Reranker-0.6B", None) is QWEN3_RERANKER
    assert card_format("reranker", "hf:Qwen/Qwen3-Reranker-4B") is QWEN3_RERANKER
    assert card_format("smollm2", "hf:HuggingFaceTB/SmolLM2-135M-Instruct") is None


def test_the_decision_prompt_shares_the_query_and_asks_of_each_document(qwen3: LoadedModel) -> None:
    job = decision_job(RerankJob(QUERY, DOCUMENTS, context_limit=4096))
    assert job.text == f"Query: {QUERY}" and not job.prompts
    assert [v.question.split("Document: ", 1)[1].split("\n")[0] for v in job.questions] == DOCUMENTS
    scores, shared = _run(qwen3, job)
    assert len(scores) == 3 and all(0 <= s <= 1 for s in scores) and shared > 5  # the query prefilled once


def test_qwen3_rerankers_score_is_its_cards_own(qwen3: LoadedModel) -> None:
    """p(yes) against p(no) at the end of the card's prompt, read from a plain forward of each prompt."""
    job = decision_job(RerankJob(QUERY, DOCUMENTS, context_limit=4096), QWEN3_RERANKER)
    scores, shared = _run(qwen3, job)
    tokenizer = qwen3.tokenizer
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    for document, score in zip(DOCUMENTS, scores, strict=True):
        prompt = QWEN3_RERANKER.prompt(QUERY, document)
        assert prompt.startswith("<|im_start|>system\nJudge whether the Document meets the requirements")
        assert prompt.endswith(f"<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
        logits = qwen3.model(mx.array([tokenizer.encode(prompt)]))[0, -1].astype(mx.float32)
        expected = mx.softmax(mx.array([logits[yes], logits[no]]))[0].item()
        # The shared prefix and batched suffixes against one plain forward: float32 sums in another order.
        assert abs(score - expected) < F32_TINY_PROBABILITY, (document, score, expected)
    assert shared > 30  # the card's system prompt, instruction and query: prefilled once


def test_documents_are_cut_to_their_first_tokens(qwen3: LoadedModel) -> None:
    long = "honey " * 50
    cut = truncated(qwen3.tokenizer, [long, "short"], 8)
    assert len(qwen3.tokenizer.encode(cut[0], add_special_tokens=False)) == 8 and cut[1] == "short"
