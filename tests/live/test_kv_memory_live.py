"""--memory-limit bounds the batch's key/value state: each row reserves its prompt and the tokens it
may generate at the bytes a token takes, so a request that does not fit beside the rows running waits
for them, one that never fits gets a 400 naming how many tokens do, and --kv-bits makes the same limit
hold proportionally more tokens."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2_ID, make_store

from live_server import LiveServer, start_server
from swama.engine.serving.memory import model_bytes

pytestmark = pytest.mark.slow
ROOM = 3000  # tokens of full-precision key/value state the limit leaves beside the weights
TOKEN = 30 * 2 * 3 * 64 * 4  # SmolLM2: 30 layers, keys and values, 3 heads of 64, float32


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return make_store(tmp_path_factory, "kv-memory-store", {SMOLLM2_ID: smollm2_dir})


def up(store: Path, tmp_path: Path, smollm2_dir: Path, *flags: str) -> LiveServer:
    limit = model_bytes(smollm2_dir, 4) + ROOM * TOKEN
    return start_server(store, tmp_path / f"kv-memory{'-'.join(flags)}.log", "smollm2", "--memory-limit", str(limit),
                        "--prompt-cache-bytes", "0", *flags)


@pytest.fixture(scope="module")
def full(store: Path, tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[LiveServer]:
    """The limit at full precision, shared by the tests that need no --kv-bits."""
    server = up(store, tmp_path_factory.mktemp("kv-memory-full"), smollm2_dir)
    yield server
    server.stop()


def tokens_that_fit(server: LiveServer) -> int:
    """The 400 a request too large for the limit gets names how many tokens fit."""
    r = httpx.post(f"{server.v1}/chat/completions", timeout=120, json={
        "model": "smollm2", "max_tokens": 16000, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "key/value memory" in message and "--kv-bits" in message
    return int(re.search(r", (\d+) tokens\. ", message).group(1))


def gauge(server: LiveServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return float(re.search(rf'^{name}{{model="{SMOLLM2_ID}"}} ([0-9.e+]+)$', text, re.M).group(1))


def test_quantized_caches_fit_proportionally_more_tokens(store: Path, tmp_path: Path, smollm2_dir: Path,
                                                        full: LiveServer) -> None:
    fits = {}
    for bits in (None, 8, 4):
        server = full if bits is None else up(store, tmp_path, smollm2_dir, "--kv-bits", str(bits))
        try:
            fits[bits] = tokens_that_fit(server)
            # The limit less the weights' bytes as model_bytes counts them: a whole number, printed exactly.
            assert gauge(server, "swama_kv_budget_bytes") == ROOM * TOKEN
        finally:
            if server is not full:
                server.stop()
    assert fits[None] == ROOM
    # float32 keys and values against 8 bits plus a float32 scale and bias per 32: 4 / 1.25; at 4 bits 4 / 0.75.
    assert fits[8] == ROOM * 4 * 32 // 40 and fits[4] == ROOM * 4 * 32 // 24


def test_a_request_waits_for_room_and_then_runs(full: LiveServer) -> None:
    """Two streams that reserve about 1,300 tokens each leave no room for a third of about 450: it waits
    (counted in swama_kv_waiting) until one stream ends, then runs; none fails."""
    server = full
    body = {"model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "max_tokens": 1290, "temperature": 0, "stream": True}
    stop = [threading.Event(), threading.Event()]
    started = [threading.Event(), threading.Event()]

    def stream(i: int) -> None:
        with httpx.stream("POST", f"{server.v1}/completions", json=body, timeout=300) as r:
            assert r.status_code == 200
            for _ in r.iter_lines():
                started[i].set()
                if stop[i].is_set():
                    return  # the client goes away: its row leaves the batch

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(2)]
    try:
        for t in threads:
            t.start()
        assert all(e.wait(120) for e in started)
        third: dict[str, httpx.Response] = {}
        waiter = threading.Thread(target=lambda: third.setdefault("r", httpx.post(
            f"{server.v1}/completions", json={**body, "stream": False, "max_tokens": 450, "stop": [","]},
            timeout=300)))  # it reserves 450 tokens; once it runs, its first comma ends it
        waiter.start()
        deadline = time.monotonic() + 60
        while gauge(server, "swama_kv_waiting") < 1:
            assert time.monotonic() < deadline, "the third request never waited"
            time.sleep(0.2)
        assert gauge(server, "swama_kv_reserved_bytes") <= ROOM * TOKEN
        assert "r" not in third
        stop[0].set()  # one stream ends: the third fits
        waiter.join(300)
        assert third["r"].status_code == 200, third["r"].text
        assert gauge(server, "swama_kv_waiting") == 0
    finally:
        for e in stop:
            e.set()
        for t in threads:
            t.join(60)  # both streams gone before the next test reads the shared server
