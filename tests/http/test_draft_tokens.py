"""Speculative decoding's accepted draft tokens as the front end reports them, over a fake engine:
`usage.accepted_draft_tokens` on chat, completions and responses (streamed and whole), absent when
no drafted token was accepted, and the /metrics series. The real model drafts in
tests/live/test_draft_tokens_live.py."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import served_schema_accepts
from fastapi.testclient import TestClient

from swama.engine.client import ChatRequest, EngineStatus, Finished, InstalledModel, TextDelta
from swama.generated import openai_models as om
from swama.handlers.http.app import create_app
from swama.handlers.http.observability import Metrics
from swama.handlers.http.settings import ServerSettings

MODEL = "fake/model"
TEXT = "abcdefghij"  # one token per character
STANDARD_CHAT_USAGE = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}


class FakeEngine:
    """A model that answers TEXT and says `drafted` of its tokens were drafted and accepted."""

    def __init__(self) -> None:
        self.drafted = 0

    def model_for(self, name: str, task: Any) -> InstalledModel:
        return InstalledModel(MODEL, Path("."), 0, 0)

    async def tokenize_prompt(self, model_id: str, prompt: str | list[int]) -> list[int]:
        return [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)

    async def chat(self, model_id: str, request: ChatRequest) -> AsyncIterator[Any]:
        for c in TEXT:
            yield TextDelta(c)
        yield Finished("stop", 3, len(TEXT), 0.0, 0.0, draft_tokens=self.drafted)


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("SWAMA_MODELS", str(tmp_path))
    app = create_app(ServerSettings(ui=False))
    app.state.engine = engine
    yield TestClient(app, base_url="http://localhost")  # a Host the server answers to


def _data(raw: str) -> list[dict[str, Any]]:
    payloads = [line[len("data: "):] for line in raw.splitlines() if line.startswith("data: ")]
    return [json.loads(p) for p in payloads if p != "[DONE]"]


@pytest.mark.parametrize("drafted", [0, 6])
def test_chat_usage_carries_the_accepted_draft_tokens_only_when_there_are_some(
        client: TestClient, engine: FakeEngine, drafted: int) -> None:
    engine.drafted = drafted
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    whole = client.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    data = whole.json()
    om.CreateChatCompletionResponse.model_validate(data)
    assert served_schema_accepts("CreateChatCompletionResponse", data)
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        chunks = _data("".join(r.iter_text()))
    [streamed] = [c["usage"] for c in chunks if c.get("usage")]
    for usage in (data["usage"], streamed):
        assert served_schema_accepts("CompletionUsage", usage)
        if drafted:
            assert set(usage) == STANDARD_CHAT_USAGE | {"accepted_draft_tokens"}
            assert usage["accepted_draft_tokens"] == drafted and usage["completion_tokens"] == len(TEXT)
            assert om.CompletionUsage.model_validate(usage).accepted_draft_tokens == drafted
        else:
            assert set(usage) == STANDARD_CHAT_USAGE  # byte-identical to a server without drafting


@pytest.mark.parametrize("drafted", [0, 4])
def test_completions_usage_sums_the_accepted_draft_tokens_of_every_choice(
        client: TestClient, engine: FakeEngine, drafted: int) -> None:
    engine.drafted = drafted
    body = {"model": MODEL, "prompt": ["one", "two"], "n": 2, "max_tokens": 16}
    whole = client.post("/v1/completions", json=body)
    assert whole.status_code == 200, whole.text
    data = whole.json()
    om.CreateCompletionResponse.model_validate(data)
    assert served_schema_accepts("CreateCompletionResponse", data)
    with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                         "stream_options": {"include_usage": True}}) as r:
        chunks = _data("".join(r.iter_text()))
    [streamed] = [c["usage"] for c in chunks if c.get("usage")]
    assert served_schema_accepts("CreateCompletionResponse", chunks[-1])
    for usage in (data["usage"], streamed):
        assert usage["completion_tokens"] == 4 * len(TEXT)
        if drafted:
            assert usage["accepted_draft_tokens"] == 4 * drafted  # two prompts, two choices each
        else:
            assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}


@pytest.mark.parametrize("drafted", [0, 7])
def test_responses_usage_carries_the_accepted_draft_tokens(client: TestClient, engine: FakeEngine,
                                                          drafted: int) -> None:
    engine.drafted = drafted
    body = {"model": MODEL, "input": "hi"}
    whole = client.post("/v1/responses", json=body)
    assert whole.status_code == 200, whole.text
    data = whole.json()
    om.Response.model_validate(data)
    assert served_schema_accepts("Response", data)
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        events = _data("".join(r.iter_text()))
    [done] = [e for e in events if e["type"] == "response.completed"]
    for usage in (data["usage"], done["response"]["usage"]):
        assert usage["output_tokens"] == len(TEXT)
        if drafted:
            assert usage["accepted_draft_tokens"] == drafted
            assert om.ResponseUsage.model_validate(usage).accepted_draft_tokens == drafted
        else:
            assert "accepted_draft_tokens" not in usage


def test_served_document_marks_the_field_as_a_swama_extension() -> None:
    from swama.handlers.http.openapi import merged_spec

    schemas = merged_spec()["components"]["schemas"]
    for usage in ("CompletionUsage", "ResponseUsage"):
        field = schemas[usage]["properties"]["accepted_draft_tokens"]
        assert field["x-swama-extension"] == "swama" and field["type"] == "integer"
        assert "accepted_draft_tokens" not in schemas[usage].get("required", [])
    assert not served_schema_accepts("CompletionUsage", {"prompt_tokens": 1, "completion_tokens": 1,
                                                         "total_tokens": 2, "accepted_draft_tokens": 0})


class StatusEngine:
    """What Metrics reads of an engine: its status."""

    def __init__(self, speculation: dict[str, dict[str, int]]) -> None:
        self.speculation = speculation

    def status(self) -> EngineStatus:
        return EngineStatus([MODEL], 0, 0, "bundled", 0, 0, speculation=self.speculation)


def _sample(text: str, line: str) -> float:
    [value] = [float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line + " ")]
    return value


def test_metrics_count_drafted_and_accepted_tokens_and_steps_by_kind() -> None:
    engine = StatusEngine({MODEL: {"drafted": 40, "accepted": 25, "steps": 9, "plain_steps": 3}})
    metrics = Metrics(engine)  # type: ignore[arg-type]
    metrics.generation_finished(MODEL, Finished("stop", 5, 30, 0.1, 0.2, draft_tokens=12))
    metrics.generation_finished(MODEL, Finished("stop", 5, 20, 0.1, 0.2, draft_tokens=8))
    metrics.generation_finished(MODEL, Finished("stop", 5, 20, 0.1, 0.2))
    text = metrics.exposition()[0].decode()
    assert _sample(text, f'swama_accepted_draft_tokens_total{{model="{MODEL}"}}') == 20
    assert _sample(text, f'swama_draft_tokens_total{{model="{MODEL}"}}') == 40
    assert _sample(text, f'swama_decode_steps_total{{kind="speculative",model="{MODEL}"}}') == 9
    assert _sample(text, f'swama_decode_steps_total{{kind="plain",model="{MODEL}"}}') == 3
    for name in ("swama_accepted_draft_tokens", "swama_draft_tokens", "swama_decode_steps"):
        assert re.search(rf"^# HELP {name}(_total)? \S", text, re.M), name
        assert re.search(rf"^# TYPE {name}(_total)? counter$", text, re.M), name


def test_metrics_leave_the_drafting_series_out_without_speculation() -> None:
    metrics = Metrics(StatusEngine({}))  # type: ignore[arg-type]
    metrics.generation_finished(MODEL, Finished("stop", 5, 20, 0.1, 0.2))
    text = metrics.exposition()[0].decode()
    assert "swama_draft_tokens_total{" not in text and "swama_decode_steps_total{" not in text
    assert "swama_accepted_draft_tokens_total{" not in text
