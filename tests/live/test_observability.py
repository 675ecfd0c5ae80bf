"""GET /metrics, GET /health and the request id every response carries."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TINY_ID, make_store

from live_server import LiveServer, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:
    root = make_store(tmp_path_factory, "observability-store", {TINY_ID: tiny_model_dir})
    live = start_server(root, root.parent / "observability.log", "--log-level", "info")
    yield live
    live.stop()


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus' text format (0 when it is not there yet)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{{re.escape(want)}\}})? (\S+)$" if want else
                         rf"^{re.escape(name)} (\S+)$", re.M)
    match = pattern.search(text)
    return float(match.group(1)) if match else 0.0


def test_health_says_what_is_loaded(server: LiveServer) -> None:
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["waiting"] == 0 and isinstance(body["models_loaded"], list)
    assert body["blas"] in ("openblas", "mkl", "bundled")


def test_metrics_count_requests_tokens_and_decisions(server: LiveServer) -> None:
    before = httpx.get(server.url + "/metrics").text
    r = httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": TINY_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200
    usage = r.json()["usage"]
    d = httpx.post(server.v1 + "/decisions", timeout=120, json={
        "model": TINY_ID, "input": "My invoice is wrong.", "questions": [
            {"type": "predicate", "name": "billing", "instructions": "Is this about billing?"},
            {"type": "predicate", "name": "urgent", "instructions": "Is it urgent?"}]})
    assert d.status_code == 200, d.text
    httpx.post(server.v1 + "/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    after = httpx.get(server.url + "/metrics")
    assert after.status_code == 200 and after.headers["content-type"].startswith("text/plain")
    text = after.text

    def grew(name: str, **labels: str) -> float:
        return _metric(text, name, **labels) - _metric(before, name, **labels)

    assert grew("swama_requests_total", method="POST", route="/v1/chat/completions", status="200") == 1
    assert grew("swama_requests_total", method="POST", route="/v1/chat/completions", status="404") == 1
    assert grew("swama_requests_total", method="POST", route="/v1/decisions", status="200") == 1
    assert grew("swama_generated_tokens_total", model=TINY_ID) == usage["completion_tokens"]
    assert grew("swama_prompt_tokens_total", model=TINY_ID) == usage["prompt_tokens"]
    assert grew("swama_time_to_first_token_seconds_count", model=TINY_ID) == 1
    assert grew("swama_decision_questions_total", model=TINY_ID) == 2
    assert grew("swama_prompt_cache_hit_tokens_total", model=TINY_ID) > 0  # the second question reused the prefix
    for gauge in ("swama_queue_waiting", "swama_running", "swama_models_loaded"):
        assert re.search(rf"^{gauge} ", text, re.M), gauge


def test_every_response_carries_a_request_id_that_the_access_log_names(server: LiveServer) -> None:
    mine = httpx.get(server.v1 + "/models", headers={"x-request-id": "client-42"})
    assert mine.headers["x-request-id"] == "client-42"
    theirs = httpx.post(server.v1 + "/embeddings", json={"model": "nope", "input": "x"})
    generated = theirs.headers["x-request-id"]
    assert theirs.status_code == 404 and re.fullmatch(r"req-[0-9a-f]{16}", generated)
    bad = httpx.get(server.v1 + "/models", headers={"x-request-id": "no spaces allowed here"})
    assert bad.headers["x-request-id"].startswith("req-")
    log = server.log.read_text(errors="replace")
    assert re.search(r"client-42 GET /v1/models 200 ", log)
    assert re.search(rf"{generated} POST /v1/embeddings 404 ", log)


def test_metrics_carry_the_gauges_inference_gateways_route_on(server: LiveServer) -> None:
    httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": TINY_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0})
    text = httpx.get(server.url + "/metrics").text
    assert _metric(text, "vllm:num_requests_waiting") == _metric(text, "swama_queue_waiting")
    assert _metric(text, "vllm:num_requests_running") == _metric(text, "swama_running")
    usage = _metric(text, "vllm:kv_cache_usage_perc")
    assert usage == _metric(text, "swama_kv_cache_usage") and 0 < usage <= 1  # the finished row's cache is kept
    assert _metric(text, "swama_kv_cache_bytes") > 0
    assert "swama_ranks" not in text  # one process: no rank group
