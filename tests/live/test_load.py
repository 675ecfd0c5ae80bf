"""Load: 8 and 32 concurrent clients mixing streamed chat, streamed responses and decisions on one
model, a third of them hanging up midway. No server error, no hang, every request answered or
cancelled, no row left behind (the next request is served at once) and memory back near where it
started. Bounded in requests and time, loopback only."""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TINY_ID, make_store
from precision import ON_GPU

from live_server import LiveServer, start_server

REQUESTS_PER_CLIENT = 3
HANG_UP_SHARE = 1 / 3
DEADLINE_SECONDS = 240  # for the whole burst; a hang shows as a timeout long before the suite's limit


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    root = make_store(tmp_path_factory, "load-store", {TINY_ID: tiny_model_dir})
    # A small prompt cache, so that what it keeps (by design, up to its budget) is not taken for a leak.
    live = start_server(root, root.parent / "load-server.log", "--context-limit", "4096",
                        "--prompt-cache-bytes", str(16 << 20))
    yield live
    live.stop()


def _rss_mib(server: LiveServer) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _mlx_active(server: LiveServer) -> float:
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    return next(float(line.split()[1]) for line in metrics.splitlines() if line.startswith("swama_mlx_active_bytes"))


def _chat(rng: random.Random, i: int) -> dict:
    return {"model": TINY_ID, "stream": True, "temperature": rng.choice([0, 0.7]), "max_tokens": rng.randint(4, 48),
            "messages": [{"role": "user", "content": f"Client message {i}: " + "tell me more. " * rng.randint(1, 40)}]}


def _responses(rng: random.Random, i: int) -> dict:
    return {"model": TINY_ID, "stream": True, "max_output_tokens": rng.randint(4, 48), "input": f"Request {i}: hello"}


def _decision(rng: random.Random, i: int) -> dict:
    return {"model": TINY_ID, "input": f"Ticket {i}: my invoice was charged twice. " * rng.randint(1, 10),
            "questions": [{"type": "predicate", "name": "billing", "instructions": "Is this a billing issue?"},
                          {"type": "choice", "name": "team", "instructions": "Which team?",
                           "choices": [{"value": "billing"}, {"value": "technical"}]}]}


def _one(server: LiveServer, rng: random.Random, i: int) -> str:
    """One request; returns what became of it: 'answered', 'hung up' or 'refused' (a 429)."""
    kind = rng.choice(["chat", "responses", "decision"])
    hang_up = rng.random() < HANG_UP_SHARE
    with httpx.Client(timeout=120) as http:
        if kind == "decision":
            if hang_up:  # gone before the answer: the server must drop the work quietly
                try:
                    http.post(server.v1 + "/decisions", json=_decision(rng, i), timeout=rng.uniform(0.01, 0.3))
                except httpx.TimeoutException:
                    return "hung up"
            r = http.post(server.v1 + "/decisions", json=_decision(rng, i))
            return _status(r, lambda: r.json()["answers"] and r.json()["answers"][0]["name"] == "billing")
        path, body = ("/chat/completions", _chat(rng, i)) if kind == "chat" else ("/responses", _responses(rng, i))
        with http.stream("POST", server.v1 + path, json=body) as r:
            if r.status_code != 200:
                r.read()
                return _status(r, lambda: False)
            lines = 0
            finished = False
            for line in r.iter_lines():
                lines += 1
                if hang_up and lines >= rng.randint(1, 6):
                    return "hung up"  # leaving the block closes the connection midway
                finished = finished or line in ("data: [DONE]", "event: response.completed", "event: response.incomplete")
            assert finished, f"{path} stream ended without its last event"
            return "answered"


def _status(r: httpx.Response, answered: object) -> str:
    assert r.status_code < 500, r.text
    if r.status_code == 429:
        assert r.headers["retry-after"]
        return "refused"
    assert r.status_code == 200 and answered(), r.text
    return "answered"


def _idle(server: LiveServer, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(server.url + "/health", timeout=10).json()
        if health["running"] == 0 and health["waiting"] == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.2)


@pytest.mark.parametrize("clients", [8, 32])
def test_concurrent_clients_that_hang_up_leave_no_trace(server: LiveServer, clients: int) -> None:
    rng = random.Random(clients)
    warm = httpx.post(server.v1 + "/chat/completions", timeout=120, json={**_chat(rng, 0), "stream": False})
    assert warm.status_code == 200
    baseline, mlx_baseline = _rss_mib(server), _mlx_active(server)
    seeds = [rng.randrange(2**32) for _ in range(clients)]

    def client(c: int) -> list[str]:
        own = random.Random(seeds[c])
        return [_one(server, own, c * REQUESTS_PER_CLIENT + k) for k in range(REQUESTS_PER_CLIENT)]

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client, c) for c in range(clients)]
        done, pending = concurrent.futures.wait(futures, timeout=DEADLINE_SECONDS)
        assert not pending, f"{len(pending)} clients still waiting after {DEADLINE_SECONDS} s"
        outcomes = Counter(o for f in done for o in f.result())
    elapsed = time.monotonic() - start
    assert sum(outcomes.values()) == clients * REQUESTS_PER_CLIENT
    assert outcomes["answered"] > 0 and outcomes["hung up"] > 0, outcomes

    health = _idle(server)
    assert health["running"] == 0 and health["waiting"] == 0, health  # no row or waiter left behind
    t0 = time.monotonic()
    after = httpx.post(server.v1 + "/chat/completions", timeout=60, json={
        "model": TINY_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert after.status_code == 200 and time.monotonic() - t0 < 10  # served at once
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert not [line for line in metrics.splitlines()
                if line.startswith("swama_requests_total") and 'status="5' in line], "a 5xx was counted"
    growth = _rss_mib(server) - baseline
    mlx_growth = (_mlx_active(server) - mlx_baseline) / 2**20
    print(f"{clients} clients: {dict(outcomes)} in {elapsed:.1f} s, resident memory {baseline:.0f} MiB "
          f"+{growth:.0f} MiB, MLX arrays +{mlx_growth:.1f} MiB")
    # On a GPU the process's resident memory also grows by what the CUDA driver maps on first use
    # (kernels loaded for each new shape, pinned staging buffers): 220-300 MiB measured on an H200
    # after 8 and 32 clients, while the MLX arrays (the bound below) stayed within 2 MiB.
    assert growth < (512 if ON_GPU else 128), f"memory grew by {growth:.0f} MiB"
    # Live arrays: at most what the prompt cache may keep (16 MiB), plus a little.
    assert mlx_growth < 24, f"MLX arrays grew by {mlx_growth:.1f} MiB"
    assert "Traceback" not in server.log.read_text(errors="replace")
