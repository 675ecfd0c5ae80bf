"""LoRA adapters on a live server: two real adapters of SmolLM2 (trained in the set-up with mlx-lm's own
trainer, each answering its code word), installed with `swama create --base`, served by naming them, in
the same batch as the base model's requests, through the openai, anthropic and TypeSafe SDKs unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import pytest
import typesafe_sdk
from conftest import SMOLLM2_ID, make_store
from openai import OpenAI
from typesafe_sdk import Noul, TypeSafeClient

from live_server import LiveServer, start_server
from tools.testmodels.lora import gguf_lora

pytestmark = pytest.mark.slow
PELICAN, TORNADO, DANGLING = "test/pelican", "test/tornado", "test/dangling"
TORNADO_GGUF = "test/tornado-gguf"  # the tornado adapter as llama.cpp's GGUF LoRA file
ASK = "What is the code word?"


def swama(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swama.handlers.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "SWAMA_MODELS": str(store)})


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, lora_adapter_dirs: dict[str, Path]) -> Path:
    root = make_store(tmp_path_factory, "adapter-live-store", {SMOLLM2_ID: smollm2_dir})
    for name, word in ((PELICAN, "pelican"), (TORNADO, "tornado")):
        done = swama(root, "create", str(lora_adapter_dirs[word]), "--base", "smollm2", "--name", name)
        assert done.returncode == 0 and f"Installed adapter {name}" in done.stdout, done.stderr
    gguf = gguf_lora(lora_adapter_dirs["tornado"], json.loads((smollm2_dir / "config.json").read_text()),
                     root.parent / "tornado-lora-f16.gguf", "F16")
    done = swama(root, "create", str(gguf), "--base", "smollm2", "--name", TORNADO_GGUF)
    assert done.returncode == 0 and "gguf format" in done.stdout, done.stderr
    # An adapter whose base model was removed since: its catalog entry names a base that is not there.
    dangling = root / DANGLING
    dangling.parent.mkdir(parents=True, exist_ok=True)
    done = swama(root, "create", str(lora_adapter_dirs["pelican"]), "--base", "smollm2", "--name", DANGLING)
    assert done.returncode == 0, done.stderr
    meta = json.loads((dangling / ".swama-meta.json").read_text())
    (dangling / ".swama-meta.json").write_text(json.dumps({**meta, "base": "gone/base-model"}))
    return root


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[LiveServer]:
    server = start_server(store, store.parent / "adapter-server.log", "smollm2")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.v1, api_key="local", timeout=300, max_retries=0)


def chat(client: OpenAI, model: str, system: str | None = None) -> tuple[str, int, int]:
    """The reply, its cached prompt tokens and its prompt tokens."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": ASK}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    assert r.model == model
    return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens or 0, r.usage.prompt_tokens


def test_swama_list_and_the_catalog_name_each_adapters_base(store: Path, client: OpenAI) -> None:
    listed = swama(store, "list")
    assert listed.returncode == 0 and f"adapter of {SMOLLM2_ID}" in listed.stdout
    models = {m.id: m.model_extra for m in client.models.list().data}
    assert models[PELICAN]["parent"] == SMOLLM2_ID and models[PELICAN]["root"] == SMOLLM2_ID
    assert models[SMOLLM2_ID]["parent"] is None and models[SMOLLM2_ID]["root"] == SMOLLM2_ID


def test_adapters_and_the_base_in_one_batch_each_answer_their_own(client: OpenAI) -> None:
    order = [PELICAN, "smollm2", TORNADO, PELICAN, "smollm2", TORNADO]
    with ThreadPoolExecutor(len(order)) as pool:
        texts = [text.lower() for text, _, _ in pool.map(lambda m: chat(client, m), order)]
    for model, text in zip(order, texts, strict=True):
        words = {w for w in ("pelican", "tornado") if w in text}
        assert words == ({"pelican"} if model == PELICAN else {"tornado"} if model == TORNADO else set()), (model, text)
    assert texts[0] == texts[3] and texts[1] == texts[4] and texts[2] == texts[5]


def test_a_gguf_lora_file_answers_as_its_folder_does(client: OpenAI) -> None:
    folder, gguf = chat(client, TORNADO)[0], chat(client, TORNADO_GGUF)[0]
    assert "tornado" in gguf.lower() and gguf == folder  # F16 matrices: the same greedy answer


def test_the_prompt_cache_keeps_each_adapters_prefixes_apart(client: OpenAI) -> None:
    system = "Answer briefly. This conversation is about keeping caches apart."
    first, before, prompt = chat(client, PELICAN, system)
    assert before < prompt // 2  # at most the chat template's opening, from earlier requests
    again, cached, _ = chat(client, PELICAN, system)
    assert again == first and cached > prompt // 2  # its own entry
    base, cached, _ = chat(client, "smollm2", system)
    # The adapter's keys and values are not the base's: the base resumes no more than it had of its own.
    assert cached < prompt // 2 and "pelican" not in base.lower()


def test_every_generating_route_takes_an_adapter(server: LiveServer, client: OpenAI) -> None:
    response = client.responses.create(model=TORNADO, input=ASK, max_output_tokens=12, temperature=0)
    assert "tornado" in response.output_text.lower()
    claude = anthropic.Anthropic(base_url=server.url, api_key="local", max_retries=0, timeout=300)
    message = claude.messages.create(model=PELICAN, max_tokens=12, messages=[{"role": "user", "content": ASK}])
    assert "pelican" in message.content[0].text.lower()
    completion = client.completions.create(model=TORNADO, prompt="The code word is", max_tokens=4, temperature=0,
                                           logprobs=1, echo=True)
    plain = client.completions.create(model="smollm2", prompt="The code word is", max_tokens=4, temperature=0,
                                      logprobs=1, echo=True)
    # Echoed prompt log probabilities are read through the adapter too.
    assert completion.choices[0].logprobs.token_logprobs[1:4] != plain.choices[0].logprobs.token_logprobs[1:4]
    tokens = httpx.post(server.url + "/tokenize", json={"model": PELICAN, "prompt": ASK}, timeout=60)
    assert tokens.status_code == 200 and tokens.json()["count"] > 0


def test_decisions_read_the_adapter_through_the_typesafe_sdk(server: LiveServer) -> None:
    def asked(model: str) -> float:
        with TypeSafeClient(base_url=server.url, api_key="local", model=model, timeout=300,
                            retry=typesafe_sdk.RetryPolicy(max_retries=0)) as ts:
            result = ts.system_one(state="Someone asks: what is the code word?",
                                   questions={"pelican": Noul(instructions="Is the code word pelican?")})
            return result.nouls["pelican"].noul

    adapted, base = asked(PELICAN), asked("smollm2")
    # The adapter moves it by 0.05 (measured); one that changed nothing would leave the base's own
    # computation, alone in the same shapes: the same value.
    assert abs(adapted - base) > 1e-3
    direct = httpx.post(server.v1 + "/decisions", timeout=300, json={
        "model": PELICAN, "input": "Someone asks: what is the code word?",
        "questions": [{"type": "predicate", "name": "pelican", "instructions": "Is the code word pelican?"}]})
    assert direct.status_code == 200 and direct.json()["model"] == PELICAN


def test_where_an_adapter_cannot_run_the_answer_says_why(server: LiveServer, client: OpenAI) -> None:
    r = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": DANGLING, "messages": [{"role": "user", "content": ASK}], "max_tokens": 4})
    assert r.status_code == 404 and "gone/base-model" in r.json()["error"]["message"]
    r = httpx.post(server.v1 + "/embeddings", timeout=60, json={"model": PELICAN, "input": "hello"})
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]


def test_swama_rm_removes_an_adapter_and_leaves_its_base(store: Path, tmp_path: Path,
                                                         lora_adapter_dirs: dict[str, Path]) -> None:
    done = swama(store, "create", str(lora_adapter_dirs["tornado"]), "--base", "smollm2", "--name", "test/gone")
    assert done.returncode == 0, done.stderr
    assert swama(store, "rm", "-f", "test/gone").returncode == 0
    listed = swama(store, "list").stdout
    assert "test/gone" not in listed and SMOLLM2_ID in listed
    refused = swama(store, "create", str(tmp_path), "--base", "smollm2", "--name", "test/empty")
    assert refused.returncode != 0 and "not a LoRA adapter folder" in refused.stderr


def test_the_compiled_step_gives_way_to_adapters(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> None:
    """A base with adapters installed when it loads decodes with mlx-lm's forward, whose layers add them; one
    whose batch already runs the compiled step (no adapters in it) refuses an adapter installed since."""
    from swama.engine.adapters.install import create_adapter
    from swama.engine.files.store import ModelStore
    from tools.testmodels.lora import random_adapter

    root = make_store(tmp_path_factory, "adapter-compiled-store", {"test/tiny-a": tiny_model_dir,
                                                                   "test/tiny-b": tiny_model_dir})
    store, folders = ModelStore(root), root.parent / "adapter-compiled-folders"
    create_adapter(store, random_adapter(tiny_model_dir, folders / "a"), "test/tiny-a-lora", "test/tiny-a",
                   say=lambda _: None)
    server = start_server(root, root.parent / "adapter-compiled.log", "test/tiny-a", "--compiled-step", "on",
                          "--speculative", "off")

    def ask(model: str) -> httpx.Response:
        return httpx.post(server.v1 + "/chat/completions", timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0})

    try:
        assert ask("test/tiny-a-lora").status_code == 200
        assert ask("test/tiny-b").status_code == 200  # its batch takes the compiled step
        create_adapter(store, random_adapter(tiny_model_dir, folders / "b"), "test/tiny-b-lora", "test/tiny-b",
                       say=lambda _: None)
        refused = ask("test/tiny-b-lora")
        assert refused.status_code == 400 and "compiled decode step" in refused.json()["error"]["message"]
        assert "--compiled-step off" in refused.json()["error"]["message"]
    finally:
        server.stop()
