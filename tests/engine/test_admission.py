"""Admission limits: bounded queues (429 with Retry-After), a wait timeout (503), and max_tokens held to
the context window, on the pool directly and through a live server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TINY_ID, make_store

from live_server import LiveServer, start_server
from swama.engine.errors import EngineError
from swama.engine.files.store import ModelStore
from swama.engine.serving.pool import ModelPool
from swama.engine.settings import EngineSettings


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return make_store(tmp_path_factory, "admission-store", {TINY_ID: tiny_model_dir})


async def _hold(pool: ModelPool, started: asyncio.Event, release: asyncio.Event, admit: bool = True) -> str:
    async with pool.use(TINY_ID, admit=admit):
        started.set()
        await release.wait()
    return "done"


def test_the_model_queue_is_bounded_and_the_refusal_says_when_to_retry(store_root: Path) -> None:
    async def scenario() -> None:
        pool = ModelPool(ModelStore(store_root), EngineSettings(max_model_queue=2, max_queue=100))
        release = asyncio.Event()
        running = asyncio.Event()
        holder = asyncio.ensure_future(_hold(pool, running, release))
        await running.wait()
        waiters = [asyncio.ensure_future(_hold(pool, asyncio.Event(), release)) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(EngineError) as refused:
            async with pool.use(TINY_ID):
                pass
        assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
        assert "2 waiting, the limit is 2, --max-model-queue" in refused.value.message
        assert refused.value.message.startswith("Too many requests: server at capacity")
        # Work already admitted (a decision's later questions) is never refused.
        late = asyncio.ensure_future(_hold(pool, asyncio.Event(), release, admit=False))
        await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(holder, *waiters, late) == ["done"] * 4
        # Once the queue drained, the next request is admitted at once.
        async with pool.use(TINY_ID) as model:
            assert model.id == TINY_ID
        await pool.close()

    asyncio.run(scenario())


def test_the_server_wide_queue_is_bounded(store_root: Path) -> None:
    async def scenario() -> None:
        pool = ModelPool(ModelStore(store_root), EngineSettings(max_model_queue=100, max_queue=1))
        release, running = asyncio.Event(), asyncio.Event()
        holder = asyncio.ensure_future(_hold(pool, running, release))
        await running.wait()
        waiter = asyncio.ensure_future(_hold(pool, asyncio.Event(), release))
        await asyncio.sleep(0.05)
        assert pool.waiting() == 1
        with pytest.raises(EngineError, match=r"1 waiting across models, the limit is 1, --max-queue"):
            async with pool.use(TINY_ID):
                pass
        release.set()
        await asyncio.gather(holder, waiter)
        assert pool.waiting() == 0
        await pool.close()

    asyncio.run(scenario())


def test_a_request_that_waits_too_long_gives_up_with_503_and_leaves_the_queue(store_root: Path) -> None:
    async def scenario() -> None:
        pool = ModelPool(ModelStore(store_root), EngineSettings(queue_timeout=0.3))
        release, running = asyncio.Event(), asyncio.Event()
        holder = asyncio.ensure_future(_hold(pool, running, release))
        await running.wait()
        start = time.monotonic()
        with pytest.raises(EngineError) as timed_out:
            async with pool.use(TINY_ID):
                pass
        assert 0.25 < time.monotonic() - start < 2  # the 0.3 s timeout, less timer slack; far from a hang
        assert timed_out.value.status == 503 and "--queue-timeout" in timed_out.value.message
        assert pool.waiting() == 0
        release.set()
        await holder
        await pool.close()

    asyncio.run(scenario())


# ---- through a live server ----

@pytest.fixture(scope="module")
def server(store_root: Path) -> Iterator[LiveServer]:
    live = start_server(store_root, store_root.parent / "admission-server.log", "--max-model-queue", "0",
                        "--batch-rows", "1", "--context-limit", "4096")
    yield live
    live.stop()


def _long_chat() -> dict:
    return {"model": TINY_ID, "messages": [{"role": "user", "content": "Talk."}], "max_tokens": 3000,
            "temperature": 0, "stream": True}


def test_an_overflowing_queue_answers_429_on_every_route_and_recovers(server: LiveServer) -> None:
    """With one batch row and --max-model-queue 0 nothing may wait: while one request holds the row,
    every other one is refused at once in its route's envelope, and once the holder is done the next is served."""
    short = {**_long_chat(), "stream": False, "max_tokens": 2}
    assert httpx.post(server.v1 + "/chat/completions", json=short, timeout=120).status_code == 200  # loaded
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holder = pool.submit(httpx.post, server.v1 + "/chat/completions",
                             json={**_long_chat(), "stream": False}, timeout=120)
        time.sleep(1.0)  # the holder takes the idle model at once and keeps it for seconds
        assert not holder.done(), holder.result().text
        chat = httpx.post(server.v1 + "/chat/completions", json=short, timeout=60)
        assert chat.status_code == 429 and chat.headers["retry-after"] == "1"
        assert "the limit is 0, --max-model-queue" in chat.json()["error"]["message"]
        assert chat.json()["error"]["code"] == "rate_limit_exceeded"
        streamed = httpx.post(server.v1 + "/responses", json={"model": TINY_ID, "input": "hi", "stream": True})
        assert streamed.status_code == 429 and streamed.json()["error"]["type"] == "invalid_request_error"
        so = httpx.post(server.v1 + "/systemone", json={
            "model": TINY_ID, "state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it?"}}})
        assert so.status_code == 429 and so.headers["retry-after"] == "1"
        assert so.json()["error"]["message"].startswith("Too many requests: server at capacity")
        messages = httpx.post(server.v1 + "/messages", json={"model": TINY_ID, "max_tokens": 2, "stream": True,
                                                             "messages": [{"role": "user", "content": "hi"}]})
        assert messages.status_code == 429 and messages.headers["retry-after"] == "1"
        assert messages.json()["error"]["type"] == "rate_limit_error"
        assert not holder.done() and holder.result().status_code == 200
    assert httpx.post(server.v1 + "/chat/completions", json=short, timeout=60).status_code == 200


@pytest.mark.parametrize(("path", "field"), [("/chat/completions", "max_tokens"),
                                             ("/chat/completions", "max_completion_tokens"),
                                             ("/responses", "max_output_tokens")])
def test_max_tokens_beyond_the_context_window_is_a_400_naming_the_window(server: LiveServer, path: str,
                                                                         field: str) -> None:
    body = {"model": TINY_ID, field: 10**12}  # accepted before: it generated until the context filled
    body.update({"messages": [{"role": "user", "content": "hi"}]} if path.startswith("/chat") else {"input": "hi"})
    r = httpx.post(server.v1 + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "larger than the context window of 4096 tokens" in r.json()["error"]["message"]
    just_over = httpx.post(server.v1 + path, json={**body, field: 4097}, timeout=60)
    assert just_over.status_code == 400
    ok = httpx.post(server.v1 + path, json={**body, field: 8}, timeout=120)
    assert ok.status_code == 200, ok.text
