"""GET /v1/models read by both official clients from one body: the OpenAI list and System One's catalog."""

from __future__ import annotations

import datetime as dt

import httpx
import openai
import typesafe_sdk
from typesafe_sdk import TypeSafeClient

from live_server import LiveServer

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY = "test/tiny-qwen3"


def test_openai_sdk_lists_installed_models(model_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=model_server.v1, api_key="local", max_retries=0)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {SMOL, TINY, "test/tiny-qwen3-thinking", "test/tiny-opening-thinker"}
    assert all(m.object == "model" and m.owned_by == "swama" for m in models.values())
    assert {m.model_extra["kind"] for m in models.values()} == {"language"}


def test_typesafe_sdk_lists_the_catalog(model_server: LiveServer) -> None:
    with TypeSafeClient(base_url=model_server.url, api_key="local", model=SMOL,
                        retry=typesafe_sdk.RetryPolicy(max_retries=0)) as ts:
        catalog = ts.models.list().models
    names = [m.name for m in catalog]
    # The server was started with smollm2, so System One's default name leads the list and means it.
    assert names == ["jev-latest", SMOL, "test/tiny-opening-thinker", TINY, "test/tiny-qwen3-thinking"]
    assert SMOL in catalog[0].description
    for entry in catalog:
        dt.date.fromisoformat(entry.release_date)
        assert entry.description


def test_catalog_names_are_accepted_by_systemone(model_server: LiveServer) -> None:
    catalog = httpx.get(model_server.v1 + "/models").json()["models"]
    for entry in catalog[:2]:  # jev-latest and SmolLM2 name the same model
        r = httpx.post(model_server.v1 + "/systemone", timeout=120, json={
            "model": entry["name"], "state": "I was charged twice.",
            "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}}})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == SMOL
