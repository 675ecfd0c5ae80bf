"""The prompt cache's disk tier through real servers: a prompt read once is resumed from disk by the
first request after a restart and after its model was unloaded; damaged block files are skipped,
removed and counted, never a failure; a small disk budget evicts and still serves."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2_ID, make_store

from live_server import LiveServer, start_server

pytestmark = pytest.mark.slow
SYSTEM = " ".join(f"Rule {i}: answer politely, cite the order number, and never promise a refund date."
                  for i in range(40))  # ~700 tokens: two whole blocks of 256


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return make_store(tmp_path_factory, "disk-cache-store", {SMOLLM2_ID: smollm2_dir})


def ask(server: LiveServer, question: str) -> dict:
    body = {"model": "smollm2", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    response = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def metric(server: LiveServer, name: str, tier: str | None = None) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    labels = r'\{[^}]*tier="' + tier + r'"[^}]*\}' if tier else r"(?:\{[^}]*\})?"
    found = re.findall(rf"^{name}(?:_total)?{labels} ([0-9.e+]+)$", text, re.M)
    return sum(map(float, found))


def written(server: LiveServer, seconds: float = 60) -> None:
    """Until the writer thread has put blocks on disk."""
    deadline = time.monotonic() + seconds
    while metric(server, "swama_prompt_cache_disk_written_bytes") == 0:
        assert time.monotonic() < deadline, "no block was written"
        time.sleep(0.2)
    time.sleep(0.5)  # the last block of the prompt too


def cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def concurrent_sessions_share_one_system_prompt(server: LiveServer) -> None:
    """Four sessions at once, then a fifth: every one answers, and the fifth resumes the system prompt
    the others read (from memory, or its blocks on disk), prefilling only its own question."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: ask(server, f"Session {i}: where is order {i}?"), range(4)))
    assert all(a["choices"][0]["message"]["content"] for a in answers)
    late = ask(server, "Session 5: can I change my address?")
    assert cached(late) >= 512
    assert late["usage"]["prompt_tokens"] - cached(late) < 256  # its own question, not the system prompt


def test_a_restart_resumes_from_disk_and_damage_is_skipped(store: Path, tmp_path: Path) -> None:
    """The disk tier across a restart (a damaged block skipped); on the restarted server, concurrent
    sessions share the system prompt."""
    data = tmp_path / "data"

    def up(*flags: str) -> LiveServer:
        return start_server(store, tmp_path / "disk.log", "smollm2", *flags, env={"SWAMA_DATA": str(data)})

    server = up()
    try:
        first = ask(server, "Where is my order 1234?")
        assert cached(first) == 0
        written(server)
    finally:
        server.stop()
    blocks = list((data / "prompt-cache").rglob("*.kv"))
    assert len(blocks) >= 2

    server = up()  # a new process: nothing in memory
    try:
        again = ask(server, "Where is my order 1234?")
        assert cached(again) >= 512 and cached(again) % 256 == 0
        assert again["usage"]["prompt_tokens_details"]["disk_cached_tokens"] == cached(again)  # all from disk
        assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        assert metric(server, "swama_prompt_cache_hits", "disk") == 1
        other = ask(server, "Can I change my address?")  # another session, the same system prompt
        assert cached(other) >= 512 and "disk_cached_tokens" not in other["usage"]["prompt_tokens_details"]
        concurrent_sessions_share_one_system_prompt(server)
    finally:
        server.stop()

    for path in (data / "prompt-cache").rglob("*.kv"):  # every block damaged
        path.write_bytes(path.read_bytes()[:100])
    server = up()
    try:
        damaged = ask(server, "Where is my order 1234?")
        assert cached(damaged) == 0
        assert damaged["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        assert metric(server, "swama_prompt_cache_disk_rejected") >= 1
    finally:
        server.stop()


def test_an_unloaded_model_resumes_from_disk_and_a_small_budget_evicts(store: Path, tmp_path: Path) -> None:
    server = start_server(store, tmp_path / "unload.log", "smollm2", "--idle-seconds", "2",
                          "--prompt-cache-disk-bytes", str(40 << 20), env={"SWAMA_DATA": str(tmp_path / "data")})
    try:
        first = ask(server, "Where is my order 77?")
        written(server)
        deadline = time.monotonic() + 60
        while httpx.get(f"{server.url}/health", timeout=30).json()["models_loaded"]:
            assert time.monotonic() < deadline, "the idle model was not unloaded"
            time.sleep(0.5)
        again = ask(server, "Where is my order 77?")  # loaded again: its memory tier is empty
        assert cached(again) >= 256
        assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        for i in range(3):  # more blocks than 40 MiB hold (SmolLM2: 11.8 MB a block)
            ask(server, f"Question {i}: " + "tell me about shipping. " * 60)
        deadline = time.monotonic() + 60  # the writer thread evicts as it writes, behind the answers
        while not (metric(server, "swama_prompt_cache_evictions", "disk") > 0
                   and metric(server, "swama_prompt_cache_tier_bytes", "disk") <= 40 << 20):
            assert time.monotonic() < deadline, "the disk tier did not come back within its budget"
            time.sleep(0.5)
    finally:
        server.stop()
