"""The engine in its own process, behind the door: the server process renders, tokenizes, decodes and
streams; the engine process generates. Through that boundary a client that hangs up frees its row,
a stop sequence found in the server process ends the row in the engine process, a full queue is a
429, greedy output is what the engine in process gives, and an engine process that dies ends the
requests in flight with a 503 and is started again."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TINY_ID, make_store

from live_server import LiveServer, start_server

PROMPT = [{"role": "user", "content": "Tell me about rivers, mills and bridges."}]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return make_store(tmp_path_factory, "engine-process-store", {TINY_ID: tiny_model_dir})


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[LiveServer]:
    live = start_server(store, store.parent / "engine-process-server.log", "--batch-rows", "2",
                        "--max-model-queue", "2")
    yield live
    live.stop()


def _health(server: LiveServer) -> dict:
    return httpx.get(server.url + "/health", timeout=30).json()


def _idle(server: LiveServer, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = _health(server)
        if health["running"] == 0 and health["waiting"] == 0:
            return True
        time.sleep(0.1)
    return False


def _chat(server: LiveServer, **body: object) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", timeout=120,
                      json={"model": TINY_ID, "messages": PROMPT, "temperature": 0, **body})


def test_the_engine_runs_in_a_process_of_its_own(server: LiveServer) -> None:
    assert _chat(server, max_tokens=4).status_code == 200
    engine = _health(server)["engine_process"]
    assert engine["pid"] not in (None, server.process.pid) and engine["restarts"] == 0
    assert Path(f"/proc/{engine['pid']}").exists()


def test_neither_process_loads_pytorch_where_it_is_installed(server: LiveServer) -> None:
    """PyTorch is installed here (the suite's references run on it) but swama needs none of it, and
    transformers imports it wherever it is installed: the server and its engine process keep it out,
    as a user's install (without it) does, and start seconds sooner."""
    assert importlib.util.find_spec("torch") is not None  # installed here, so the check can fail
    assert _chat(server, max_tokens=2).status_code == 200  # both processes have loaded the model
    for pid in (server.process.pid, _health(server)["engine_process"]["pid"]):
        assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text(), pid


def test_greedy_tokens_are_those_of_the_engine_in_process(server: LiveServer, store: Path) -> None:
    here = start_server(store, store.parent / "in-process-server.log", "--no-engine-process")
    try:
        assert "engine_process" not in httpx.get(here.url + "/health", timeout=30).json()
        for body in ({"max_tokens": 24}, {"max_tokens": 16, "logprobs": True, "top_logprobs": 2},
                     {"max_tokens": 12, "stop": ["e"]}):
            ours = _chat(server, **body).json()["choices"][0]
            theirs = httpx.post(here.v1 + "/chat/completions", timeout=120,
                                json={"model": TINY_ID, "messages": PROMPT, "temperature": 0, **body}).json()
            assert ours == theirs["choices"][0], body
    finally:
        here.stop()


def test_a_client_that_hangs_up_frees_its_row_in_the_engine(server: LiveServer) -> None:
    with httpx.stream("POST", server.v1 + "/chat/completions", timeout=60,
                      json={"model": TINY_ID, "messages": PROMPT, "max_tokens": 4000, "stream": True}) as r:
        for line in r.iter_lines():
            if '"content"' in line and '"content":""' not in line.replace(" ", ""):
                break  # the first token came: hang up with thousands left
    assert _idle(server), _health(server)
    assert _chat(server, max_tokens=3).status_code == 200


def test_a_stop_sequence_found_in_the_server_process_ends_the_row(server: LiveServer) -> None:
    body = _chat(server, max_tokens=2000, stop=[" "]).json()
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] < 2000
    assert _idle(server), _health(server)


def test_a_full_queue_is_a_429_from_across_the_boundary(server: LiveServer) -> None:
    """Two rows and a queue of two: of eight long streams at once, some are refused with the route's
    envelope and Retry-After; the others run; afterwards nothing is left running."""
    import concurrent.futures

    def one(i: int) -> int:
        with httpx.stream("POST", server.v1 + "/chat/completions", timeout=120,
                          json={"model": TINY_ID, "messages": PROMPT, "max_tokens": 300, "stream": True}) as r:
            if r.status_code == 429:
                error = json.loads(r.read())["error"]
                assert error["type"] and "capacity" in error["message"] and r.headers.get("retry-after")
            else:
                r.read()
            return r.status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, range(8)))
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes, codes
    assert _idle(server), _health(server)


def test_an_engine_process_that_dies_ends_requests_with_503_and_comes_back(server: LiveServer) -> None:
    assert _chat(server, max_tokens=2).status_code == 200
    before = _health(server)["engine_process"]
    with httpx.stream("POST", server.v1 + "/chat/completions", timeout=60,
                      json={"model": TINY_ID, "messages": PROMPT, "max_tokens": 4000, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        next(line for line in lines if '"content"' in line)
        os.kill(before["pid"], signal.SIGKILL)
        started = time.monotonic()
        rest = list(lines)  # the stream ends, with an error chunk: no hang
    assert time.monotonic() - started < 30
    errors = [json.loads(line[5:]) for line in rest if line.startswith("data:") and '"error"' in line]
    assert errors and "engine process stopped" in errors[0]["error"]["message"], rest[-3:]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # meanwhile a request waits for the new engine, or gets a 503
        r = _chat(server, max_tokens=2)
        assert r.status_code in (200, 503), r.text
        if r.status_code == 200:
            break
        assert r.json()["error"]["code"] in ("engine_restarted", "engine_unavailable")
        time.sleep(0.5)
    after = _health(server)["engine_process"]
    assert r.status_code == 200 and after["restarts"] == before["restarts"] + 1 and after["pid"] != before["pid"]
