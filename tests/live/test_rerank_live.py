"""Rerank on a live server through the cohere SDK unchanged (v1 `Client.rerank`, v2 `ClientV2.rerank`):
SmolLM2 scores each document through the decision scorer; the answers are checked strictly against
the served document's models, and a small relevance set built here measures the ranking (MRR)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cohere
import httpx
import pytest
from conftest import SMOLLM2_ID, make_store
from precision import BF16_PROBABILITY, BF16_TINY_PROBABILITY, F32_PROBABILITY, F32_TINY_PROBABILITY, tol

from live_server import LiveServer, start_server
from swama.generated.cohere_models import CohereRerankResponse, CohereV2RerankResponse

pytestmark = pytest.mark.slow
NO_RETRIES = {"max_retries": 0}
# One score from another batch composition (the same values in another summation order): SmolLM2's
# p(yes), and the tiny cross-encoder's sigmoid of a logit under 16 (2 layers, H 64, I 128, heads of 16).
PROBABILITY = tol(F32_PROBABILITY, BF16_PROBABILITY)
TINY_PROBABILITY = tol(F32_TINY_PROBABILITY, BF16_TINY_PROBABILITY)

# Each query with the one passage that answers it; every other query's passage is a distractor.
RELEVANCE = [
    ("What color is the sky on a clear day?", "On a clear day the sky looks blue, because air scatters blue light."),
    ("How many legs does a spider have?", "A spider has eight legs, two more than an insect."),
    ("What is the capital of France?", "Paris is the capital of France and its largest city."),
    ("At what temperature does water boil at sea level?", "At sea level water boils at 100 degrees Celsius."),
    ("Which planet is closest to the sun?", "Mercury is the planet closest to the sun."),
    ("What do bees make?", "Bees make honey from the nectar of flowers."),
    ("How many days are in a week?", "A week has seven days, from Monday to Sunday."),
    ("What is frozen water called?", "Frozen water is called ice."),
]


@pytest.fixture(scope="module")
def v2(model_server: LiveServer) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="local", base_url=model_server.url, timeout=300)


@pytest.fixture(scope="module")
def v1(model_server: LiveServer) -> cohere.Client:
    return cohere.Client(api_key="local", base_url=model_server.url, timeout=300)


def _raw(server: LiveServer, version: int, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v{version}/rerank", json=body, timeout=300)


def test_v2_ranks_every_document_with_a_score_in_0_1(v2: cohere.ClientV2, model_server: LiveServer) -> None:
    query, relevant = RELEVANCE[2]
    documents = [RELEVANCE[0][1], relevant, RELEVANCE[5][1]]
    r = v2.rerank(model="smollm2", query=query, documents=documents)
    assert sorted(x.index for x in r.results) == [0, 1, 2]
    scores = [x.relevance_score for x in r.results]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    assert r.meta.billed_units.search_units == 1 and r.meta.tokens.input_tokens > 20 and r.id
    raw = _raw(model_server, 2, {"model": SMOLLM2_ID, "query": query, "documents": documents, "top_n": 2})
    assert raw.status_code == 200, raw.text
    answer = CohereV2RerankResponse.model_validate(raw.json())  # the served document's own model, strict
    assert len(answer.results) == 2 and answer.meta.api_version.version == "2"
    # The same documents score the same however many are asked back.
    assert {x.index: x.relevance_score for x in answer.results} == {x.index: x.relevance_score for x in r.results[:2]}


def test_v1_takes_objects_rank_fields_and_returns_documents(v1: cohere.Client, model_server: LiveServer) -> None:
    query, relevant = RELEVANCE[1]
    documents = [{"text": RELEVANCE[6][1], "title": "weeks"}, {"text": relevant, "title": "spiders"}, RELEVANCE[7][1]]
    r = v1.rerank(model="smollm2", query=query, documents=documents, return_documents=True, top_n=10,
                  request_options=NO_RETRIES)
    assert len(r.results) == 3  # top_n beyond the documents: every one
    by_index = {x.index: x for x in r.results}
    assert by_index[1].document.text == relevant and by_index[1].document.title == "spiders"
    assert by_index[2].document.text == RELEVANCE[7][1]
    raw = _raw(model_server, 1, {"model": "smollm2", "query": query, "documents": documents, "return_documents": True,
                                 "rank_fields": ["title", "text"]})
    assert raw.status_code == 200, raw.text
    answer = CohereRerankResponse.model_validate(raw.json())
    assert answer.meta.api_version.version == "1" and answer.results[0].document is not None
    plain = _raw(model_server, 1, {"model": "smollm2", "query": query, "documents": documents})
    assert all("document" not in x for x in plain.json()["results"])


def test_v2_cuts_documents_to_max_tokens_per_doc(v2: cohere.ClientV2, model_server: LiveServer) -> None:
    long = "The weather report says it will rain tomorrow. " * 2000  # ~20,000 tokens: past the context
    body = {"model": "smollm2", "query": "Will it rain?", "documents": [long]}
    refused = _raw(model_server, 1, body)  # v1 reads the whole document
    assert refused.status_code == 400 and "exceeds the configured context limit" in refused.json()["message"]
    cut = v2.rerank(model="smollm2", query="Will it rain?", documents=[long], max_tokens_per_doc=64)
    short = v2.rerank(model="smollm2", query="Will it rain?", documents=[long[:200]], max_tokens_per_doc=64)
    assert cut.meta.tokens.input_tokens < 200 and short.meta.tokens.input_tokens < 200
    default = _raw(model_server, 2, body)  # cut to Cohere's default 4,096 tokens, which fit SmolLM2's context
    assert default.status_code == 200 and 4096 < default.json()["meta"]["tokens"]["input_tokens"] < 4096 + 100


@pytest.mark.parametrize("version,body,status,fragment", [
    (2, {"query": "q", "documents": []}, 400, "documents"),
    (2, {"query": "q", "documents": ["d"] * 1001}, 400, "documents"),
    (2, {"query": "   ", "documents": ["d"]}, 400, "query"),
    (2, {"query": "q", "documents": ["d"], "top_n": 0}, 400, "top_n"),
    (2, {"query": "q", "documents": ["d"], "max_tokens_per_doc": 0}, 400, "max_tokens_per_doc"),
    (2, {"query": "q", "documents": ["d"], "relevant_spans": {"mode": "enabled"}}, 400, "'relevant_spans' is not supported"),
    (1, {"query": "q", "documents": ["d"], "max_chunks_per_doc": 2}, 400, "'max_chunks_per_doc' is not supported"),
    (1, {"query": "q", "documents": [{"title": "t"}]}, 400, "documents[0] has no 'text' field"),
    (1, {"query": "q", "documents": [{"text": "t"}], "rank_fields": ["title"]}, 400, "has no 'title' field"),
    (1, {"query": "q", "documents": [{"title": "t"}], "rank_fields": ["title"]}, 400, "has no 'text' field"),
    (1, {"query": "q", "documents": ["d"], "model": "not/installed"}, 404, "not available"),
])
def test_bad_input_is_a_4xx_in_cohere_s_envelope(model_server: LiveServer, version: int, body: dict, status: int,
                                                 fragment: str) -> None:
    r = _raw(model_server, version, {"model": "smollm2", **body})
    assert r.status_code == status, r.text
    assert list(r.json()) == ["message"] and fragment in r.json()["message"]


def test_the_sdk_raises_its_own_errors(v2: cohere.ClientV2) -> None:
    with pytest.raises(cohere.BadRequestError) as bad:
        v2.rerank(model="smollm2", query="q", documents=[], request_options=NO_RETRIES)
    assert "documents" in bad.value.body["message"]
    with pytest.raises(cohere.NotFoundError):
        v2.rerank(model="nothing/here", query="q", documents=["d"], request_options=NO_RETRIES)


def test_smollm2_ranks_the_answering_passage_above_chance(v2: cohere.ClientV2) -> None:
    """Each query against all eight passages: how often its own passage comes first, and the mean
    reciprocal rank of it, each against a random order's (1/8, and the mean of 1/k over k = 1..8).
    SmolLM2-135M is a weak judge of relevance: it clears chance, not by much (docs/clients.md#rerank)."""
    passages = [p for _, p in RELEVANCE]
    ranks = []
    for i, (query, _) in enumerate(RELEVANCE):
        r = v2.rerank(model="smollm2", query=query, documents=passages)
        ranks.append([x.index for x in r.results].index(i) + 1)
    n = len(passages)
    mrr, chance_mrr = sum(1 / k for k in ranks) / len(ranks), sum(1 / k for k in range(1, n + 1)) / n
    first = sum(k == 1 for k in ranks) / len(ranks)
    print(f"MRR {mrr:.3f} (chance {chance_mrr:.3f}), first {first:.0%} (chance {1 / n:.0%}), ranks {ranks}")
    assert mrr > chance_mrr and first > 1 / n, ranks


def test_v1_score_pairs_texts_as_vllm_does(model_server: LiveServer, v2: cohere.ClientV2) -> None:
    """One text_1 against many text_2 (1:N) scores as /v2/rerank does; two lists pair up by position."""
    query, passages = RELEVANCE[4][0], [p for _, p in RELEVANCE[:3]]
    one = httpx.post(f"{model_server.url}/v1/score", json={"model": "smollm2", "text_1": query, "text_2": passages},
                     timeout=300)
    assert one.status_code == 200, one.text
    body = one.json()
    assert body["object"] == "list" and body["model"] == "smollm2" and body["usage"]["prompt_tokens"] > 20
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and all(d["object"] == "score" for d in body["data"])
    reranked = {x.index: x.relevance_score for x in v2.rerank(model="smollm2", query=query, documents=passages).results}
    # The same query and passages, scored alone in the same shapes: the same values through JSON.
    assert all(abs(d["score"] - reranked[d["index"]]) < 1e-6 for d in body["data"])
    queries = [RELEVANCE[0][0], RELEVANCE[1][0], RELEVANCE[0][0]]
    paired = httpx.post(f"{model_server.url}/v1/score", json={"model": "smollm2", "text_1": queries,
                                                              "text_2": passages}, timeout=300)
    assert paired.status_code == 200, paired.text
    alone = httpx.post(f"{model_server.url}/v1/score", json={"model": "smollm2", "text_1": [queries[1]],
                                                             "text_2": [passages[1]]}, timeout=300)
    # Its rerank ran beside the other query's: another batch composition.
    assert abs(paired.json()["data"][1]["score"] - alone.json()["data"][0]["score"]) < PROBABILITY
    for body, fragment in (({"text_1": ["a", "b"], "text_2": ["x", "y", "z"]}, "hold 2 and 3 texts"),
                           ({"text_1": "a", "text_2": []}, "text_2"),
                           ({"text_1": "a", "text_2": "b", "softmax": True}, "'softmax' is not supported")):
        r = httpx.post(f"{model_server.url}/v1/score", json={"model": "smollm2", **body}, timeout=60)
        assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text


RERANKER_ID = "test/tiny-reranker"


@pytest.fixture(scope="module")
def reranker_server(tmp_path_factory: pytest.TempPathFactory, tiny_cross_encoder_dir: Path) -> Iterator[LiveServer]:
    store = make_store(tmp_path_factory, "reranker-store", {RERANKER_ID: tiny_cross_encoder_dir})
    server = start_server(store, store.parent / "reranker-server.log")
    yield server
    server.stop()


def test_a_cross_encoder_reranks_with_its_own_scores(reranker_server: LiveServer, tiny_cross_encoder_dir: Path) -> None:
    """A tiny cross-encoder (BERT and XLM-RoBERTa) on the cohere SDK: the engine's scores, served."""
    from swama.engine.kinds.cross_encoders import score_pairs
    from swama.engine.serving.loaders import load_model

    models = httpx.get(f"{reranker_server.url}/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["kind"], m["rerank"]) for m in models] == [(RERANKER_ID, "reranker", True)]
    query, passages = RELEVANCE[0][0], [p for _, p in RELEVANCE]
    client = cohere.ClientV2(api_key="local", base_url=reranker_server.url, timeout=120)
    r = client.rerank(model=RERANKER_ID, query=query, documents=passages, top_n=3)
    want = score_pairs(load_model(RERANKER_ID, tiny_cross_encoder_dir), query, passages).scores
    assert [x.index for x in r.results] == sorted(range(len(want)), key=lambda i: -want[i])[:3]
    # The server runs score_pairs on the same pairs in the same batches: the same float32 scores.
    assert all(abs(x.relevance_score - want[x.index]) < 1e-5 for x in r.results)
    score = httpx.post(f"{reranker_server.url}/v1/score", json={"model": RERANKER_ID, "text_1": query,
                                                                 "text_2": passages[:2]}, timeout=60).json()
    # Two passages batch apart from the eight.
    assert all(abs(d["score"] - s) < TINY_PROBABILITY for d, s in zip(score["data"], want[:2], strict=True))
    chat = httpx.post(f"{reranker_server.url}/v1/chat/completions", timeout=30,
                      json={"model": RERANKER_ID, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "reranker model" in chat.json()["error"]["message"]
