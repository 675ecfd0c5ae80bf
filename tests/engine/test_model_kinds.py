"""Model kinds: read from a folder's config, recorded at install, listed, and refused where a route
needs another kind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
import yaml

from live_server import start_server
from swama.engine.files import kinds as model_kinds
from swama.engine.files.kinds import kind_from_config
from swama.engine.files.sources import create
from swama.engine.files.store import META, ModelStore


@pytest.mark.parametrize(("config", "files", "kind"), [
    ({"model_type": "qwen3"}, set(), "language"),
    ({"model_type": "llama", "vocab_size": 10}, set(), "language"),
    ({"model_type": "qwen3_vl", "vision_config": {"depth": 2}}, set(), "vision"),
    ({"model_type": "gemma3", "image_token_index": 262144}, set(), "vision"),
    ({"model_type": "bert"}, set(), "embedding"),
    ({"model_type": "mpnet"}, {"modules.json"}, "embedding"),
    ({"model_type": "bert", "architectures": ["BertForSequenceClassification"]}, set(), "reranker"),
    ({"model_type": "xlm-roberta", "architectures": ["XLMRobertaForSequenceClassification"]}, set(), "reranker"),
    ({}, {"sentence_bert_config.json"}, "embedding"),
    ({"model_type": "whisper"}, set(), "speech-to-text"),
    ({"model_type": "kokoro"}, set(), "text-to-speech"),
    ({}, set(), "language"),
])
def test_kind_from_config(config: dict, files: set[str], kind: str) -> None:
    assert kind_from_config(config, files) == kind


def test_the_served_schema_names_every_kind(repo_root: Path) -> None:
    doc = yaml.safe_load((repo_root / "specs" / "openai.yaml").read_text())
    assert tuple(doc["components"]["schemas"]["Model"]["properties"]["kind"]["enum"]) == model_kinds.KINDS


def _vision_copy(tiny_model_dir: Path, dest: Path) -> Path:
    """The tiny language model's files under a config that says vision (enough to be judged one)."""
    shutil.copytree(tiny_model_dir, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "vision_config": {"depth": 1}}))
    return dest


def test_kind_is_recorded_at_install_and_derived_for_older_installs(tmp_path: Path, tiny_model_dir: Path) -> None:
    store = ModelStore(tmp_path / "store")
    installed = create(store, _vision_copy(tiny_model_dir, tmp_path / "vl"), "test/tiny-vl", say=lambda _: None)
    assert installed.kind == "vision"
    assert json.loads((installed.path / META).read_text())["kind"] == "vision"
    meta = json.loads((installed.path / META).read_text())
    del meta["kind"]
    (installed.path / META).write_text(json.dumps(meta))
    assert store.get("test/tiny-vl").kind == "vision"


def test_routes_refuse_a_model_of_another_kind_by_name(tmp_path: Path, tiny_model_dir: Path) -> None:
    root = tmp_path / "store"
    encoder = shutil.copytree(tiny_model_dir, tmp_path / "emb")
    (encoder / "config.json").write_text(json.dumps({**json.loads((encoder / "config.json").read_text()),
                                                     "model_type": "bert"}))
    create(ModelStore(root), encoder, "test/tiny-emb", say=lambda _: None)
    server = start_server(root, tmp_path / "server.log")
    try:
        models = httpx.get(server.v1 + "/models").json()["data"]
        assert [(m["id"], m["kind"]) for m in models] == [("test/tiny-emb", "embedding")]
        for path, body in [
            ("/chat/completions", {"model": "test/tiny-emb", "messages": [{"role": "user", "content": "hi"}]}),
            ("/responses", {"model": "test/tiny-emb", "input": "hi"}),
            ("/decisions", {"model": "test/tiny-emb", "input": "x",
                            "questions": [{"type": "predicate", "instructions": "Is it?"}]}),
            ("/systemone", {"model": "test/tiny-emb", "state": "x",
                            "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}),
        ]:
            r = httpx.post(server.v1 + path, json=body, timeout=60)
            assert r.status_code == 400, (path, r.text)
            assert "'test/tiny-emb' is an embedding model" in r.json()["error"]["message"], path
    finally:
        server.stop()
