"""`swama serve smollm2 --replicas 2` on a local Ray started by the server: both replicas serve and say
which answered, a conversation's next turn lands on the replica holding its prompt and reports the
cached tokens, a replica killed mid-request fails its requests clearly while the other answers and
Ray replaces it, and stopping the server stops Ray with no process left behind. Loopback only;
every wait is bounded."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2_ID, TINY_ID

from live_server import LiveServer, processes_marked, read_http_answer, start_server

pytestmark = pytest.mark.slow

# Every process of the server's Ray session inherits this variable: how the test finds them, and
# only them, whatever else runs Ray on the machine.
MARK = "SWAMA_TEST_RAY_SESSION"
STOP_SECONDS = 90  # Serve, then Ray: a few seconds here; never a kill, which would orphan Ray
STORY = "Write a very long story about a lighthouse keeper and the ships he saw."


@dataclass
class Replicated:
    server: LiveServer
    mark: str


def _stop(server: LiveServer) -> int | None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    return server.process.wait(STOP_SECONDS)


@pytest.fixture(scope="module")
def replicated(model_store: Path) -> Iterator[Replicated]:
    mark = uuid.uuid4().hex
    server = start_server(model_store, model_store.parent / "replicas-server.log", "smollm2", "--replicas", "2",
                          env={MARK: mark}, timeout=300)
    try:
        yield Replicated(server, mark)
    finally:
        _stop(server)


def _replicas(server: LiveServer, want: int = 2, within: float = 120) -> dict[str, int]:
    """Replica id -> pid, from /health, once `want` replicas have answered (least-loaded routing
    spreads idle requests at random)."""
    deadline = time.monotonic() + within
    seen: dict[str, int] = {}
    while time.monotonic() < deadline:
        replica = httpx.get(server.url + "/health", timeout=30).json()["replica"]
        seen[replica["id"]] = replica["pid"]
        if len(seen) >= want:
            return seen
    raise AssertionError(f"only {seen} answered /health within {within} s")


def _chat(server: LiveServer, messages: list[dict], max_tokens: int, model: str = SMOLLM2_ID) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})


def test_both_replicas_serve_and_say_which(replicated: Replicated) -> None:
    server = replicated.server
    ids = _replicas(server)
    assert len(set(ids.values())) == 2  # two processes
    answered = set()
    for i in range(12):  # no affinity between these: each goes to the less loaded replica
        r = _chat(server, [{"role": "user", "content": f"Say {i}."}], 2, model=TINY_ID)
        assert r.status_code == 200 and r.headers["x-swama-replica"] in ids
        answered.add(r.headers["x-swama-replica"])
    assert answered == set(ids)
    metrics = httpx.get(server.url + "/metrics", timeout=30)
    assert metrics.headers["x-swama-replica"] in ids and "swama_requests_total" in metrics.text


def test_a_conversation_s_next_turn_lands_on_its_replica_and_resumes_its_prompt(replicated: Replicated) -> None:
    server = replicated.server
    for topic in ("rivers", "mountains", "deserts"):
        messages = [{"role": "system", "content": "You are a geography teacher."},
                    {"role": "user", "content": f"Name three famous {topic}."}]
        first = _chat(server, messages, 24)
        assert first.status_code == 200
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "Which is the largest?"}]
        second = _chat(server, messages, 8)
        assert second.headers["x-swama-replica"] == first.headers["x-swama-replica"]
        usage = second.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= first.json()["usage"]["prompt_tokens"]
    # Decision requests that share an input go to the same replica.
    ticket = "Ticket: I was charged twice for my order and want a refund."
    replicas = {httpx.post(server.v1 + "/decisions", timeout=120, json={
        "model": TINY_ID, "input": ticket, "questions": [{"type": "predicate", "name": "q", "instructions": ask}]})
        .headers["x-swama-replica"] for ask in ("Is it about billing?", "Is it urgent?", "Is the customer angry?")}
    assert len(replicas) == 1


def test_a_replica_that_dies_fails_its_requests_clearly_and_the_other_answers(replicated: Replicated) -> None:
    server = replicated.server
    pids = _replicas(server)
    # Mid-stream: the stream ends with the route's error chunk, then [DONE]; no hang.
    body = {"model": SMOLLM2_ID, "stream": True, "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": STORY}]}
    lines = []
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=60) as stream:
        victim = stream.headers["x-swama-replica"]
        for line in stream.iter_lines():
            if line:
                lines.append(line)
            if len(lines) == 3:
                os.kill(pids[victim], signal.SIGKILL)
    assert lines[-1] == "data: [DONE]" and len(lines) < 400
    assert '"finish_reason":"error"' in lines[-2] and '"code":"replica_failed"' in lines[-2]
    # Ray replaces the dead replica.
    replaced = _replicas(server, within=180)
    assert victim not in replaced and len(replaced) == 2

    # Before the response began: a 503 in the route's envelope. The conversation's second turn goes
    # where its first ran, so the test knows which replica to stop.
    messages = [{"role": "user", "content": STORY}]
    first = _chat(server, messages, 4)
    victim = first.headers["x-swama-replica"]
    messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "Go on, at length."}]
    result: dict[str, httpx.Response] = {}
    caller = threading.Thread(target=lambda: result.update(r=_chat(server, messages, 400)))
    caller.start()
    time.sleep(1.5)
    os.kill(replaced[victim], signal.SIGKILL)
    caller.join(120)
    failed = result["r"]
    assert failed.status_code == 503 and failed.headers["retry-after"] == "1"
    error = failed.json()["error"]
    assert error["code"] == "replica_failed" and "stopped before it finished" in error["message"]
    # The next requests are answered, by the replica still running.
    for i in range(3):
        r = _chat(server, [{"role": "user", "content": f"Count to {i + 2}."}], 4)
        assert r.status_code == 200 and r.headers["x-swama-replica"] != victim


def test_the_ingress_refuses_a_body_past_the_routes_limit_before_reading_it(replicated: Replicated) -> None:
    """A request declaring 10 GiB of body is refused at once by its declared length; the ingress read
    every body whole before, with no limit (this one it would have waited for)."""
    port = int(replicated.server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 10737418240\r\n\r\n{")
        answer = read_http_answer(raw).decode()
    assert answer.startswith("HTTP/1.1 413") and "request_too_large" in answer, answer[:500]


def test_stopping_the_server_stops_ray_and_leaves_no_process(replicated: Replicated) -> None:
    session = processes_marked(MARK, replicated.mark)
    names = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in session if Path(f"/proc/{pid}").exists()]
    assert any(b"raylet" in n for n in names) and any(b"ServeReplica" in n for n in names)
    assert _stop(replicated.server) == 0
    deadline = time.monotonic() + 30
    while (left := processes_marked(MARK, replicated.mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in left]
