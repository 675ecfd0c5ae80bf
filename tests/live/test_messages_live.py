"""POST /v1/messages and /v1/messages/count_tokens with the anthropic SDK against the live server:
create, stream (event order checked against the SDK's own accumulator), tools, count_tokens,
thinking on the tiny Qwen3 models, and every error type in Anthropic's envelope."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import anthropic
import httpx
import pytest
from PIL import Image

from live_server import LiveServer, start_server

pytestmark = pytest.mark.slow

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QWEN3 = "test/tiny-qwen3-thinking"
OPENING = "test/tiny-opening-thinker"
# The 2.10 SDK no longer names Anthropic's sampling parameters; the route still takes them.
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def client(model_server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=model_server.url, api_key="local", max_retries=0, timeout=300)


def test_create_answers_in_anthropics_shape(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=SMOL, max_tokens=24, messages=ASK, extra_body=GREEDY,
                               system="You are a helpful assistant.")
    assert m.type == "message" and m.role == "assistant" and m.model == SMOL and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and "Paris" in m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.usage.input_tokens > 10 and 0 < m.usage.output_tokens <= 24


def test_stream_events_match_the_sdk_accumulator(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=SMOL, max_tokens=24, messages=ASK, extra_body=GREEDY)
    with client.messages.stream(model=SMOL, max_tokens=24, messages=ASK, extra_body=GREEDY) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
        text = "".join(b.text for b in final.content if b.type == "text")
    assert final.content[0].text == whole.content[0].text == text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    # The SDK's own event sequence (text and content_block_* events interleave).
    raw = [e for e in events if e not in ("text",)]
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}


def test_raw_stream_has_anthropics_event_names(model_server: LiveServer) -> None:
    with httpx.stream("POST", model_server.v1 + "/messages", timeout=120,
                      json={"model": SMOL, "max_tokens": 4, "messages": ASK, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        names = [line.split(": ", 1)[1] for line in r.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["message_delta", "message_stop"]


def test_stop_sequences_and_max_tokens(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=SMOL, max_tokens=40, extra_body=GREEDY, stop_sequences=["Paris"], messages=ASK)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "Paris"
    assert "Paris" not in "".join(b.text for b in m.content if b.type == "text")
    short = client.messages.create(model="test/tiny-qwen3", max_tokens=3, messages=ASK)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3
    # max_tokens past the context window is held to it, not refused.
    huge = client.messages.create(model="test/tiny-qwen3", max_tokens=10_000_000, messages=ASK,
                                  stop_sequences=["e"])
    assert huge.type == "message"


def test_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = client.messages.create(model=SMOL, max_tokens=64, extra_body=GREEDY, tools=[WEATHER], messages=ask,
                               tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use"
    use = next(b for b in m.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict) and use.id
    # Streamed: the call arrives as input_json_delta and the SDK assembles the same input.
    with client.messages.stream(model=SMOL, max_tokens=64, extra_body=GREEDY, tools=[WEATHER], messages=ask,
                                tool_choice={"type": "any"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content][-1] == "tool_use"
    assert final.content[-1].input == use.input
    # The result goes back as a tool_result block; the model answers with text.
    follow = client.messages.create(model=SMOL, max_tokens=32, extra_body=GREEDY, tools=[WEATHER], messages=[
        *ask, {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]}])
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use") and follow.content
    # tool_choice none keeps the tools from the model.
    none = client.messages.create(model=SMOL, max_tokens=16, extra_body=GREEDY, tools=[WEATHER], messages=ask,
                                  tool_choice={"type": "none"})
    assert all(b.type == "text" for b in none.content)


def test_count_tokens_matches_create_usage(client: anthropic.Anthropic) -> None:
    for extra in ({}, {"tools": [WEATHER]}, {"system": [{"type": "text", "text": "Be brief."}]}):
        counted = client.messages.count_tokens(model=SMOL, messages=ASK, **extra)
        made = client.messages.create(model=SMOL, max_tokens=1, messages=ASK, **extra)
        assert counted.input_tokens == made.usage.input_tokens + made.usage.cache_read_input_tokens
    on = client.messages.count_tokens(model=QWEN3, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024})
    off = client.messages.count_tokens(model=QWEN3, messages=ASK, thinking={"type": "disabled"})
    assert off.input_tokens == on.input_tokens + 4  # Qwen3 renders a closed, empty block when off


def test_prompt_cache_reads_show_in_usage(client: anthropic.Anthropic) -> None:
    system = [{"type": "text", "text": "You answer questions about geography. " * 20,
               "cache_control": {"type": "ephemeral"}}]
    client.messages.create(model=SMOL, max_tokens=2, messages=ASK, system=system)
    again = client.messages.create(model=SMOL, max_tokens=2, messages=ASK, system=system)
    assert again.usage.cache_read_input_tokens > 100
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens > again.usage.cache_read_input_tokens


def test_thinking_blocks_on_a_model_that_thinks(client: anthropic.Anthropic) -> None:
    # The generation prompt opens the block; the budget closes it, and the answer follows.
    m = client.messages.create(model=OPENING, max_tokens=1024 + 12, extra_body=GREEDY, messages=ASK,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking and m.content[0].signature and m.content[1].text
    with client.messages.stream(model=OPENING, max_tokens=1024 + 12, extra_body=GREEDY, messages=ASK,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert final.content[0].thinking == m.content[0].thinking and final.content[1].text == m.content[1].text
    assert deltas.index("signature_delta") < deltas.index("text_delta")
    assert set(deltas[:deltas.index("signature_delta")]) == {"thinking_delta"}
    # Disabled: Qwen3.5's form closes an empty block in the prompt, and there is no thinking block.
    off = client.messages.create(model=OPENING, max_tokens=8, extra_body=GREEDY, messages=ASK,
                                 thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    # Thinking from an earlier turn goes back as a block (signature and all).
    again = client.messages.create(model=OPENING, max_tokens=8, extra_body=GREEDY, thinking={"type": "disabled"},
                                   messages=[*ASK, {"role": "assistant", "content": m.content},
                                             {"role": "user", "content": "Sure?"}])
    assert again.content


def test_prefill_continues_an_opened_think_block_on_qwen3(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=QWEN3, max_tokens=20, extra_body=GREEDY, thinking={"type": "adaptive"},
                               messages=[*ASK, {"role": "assistant", "content": "<think>\n"}])
    assert m.content[0].type == "thinking" and m.stop_reason == "max_tokens"


def _png() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_images_need_a_vision_model(client: anthropic.Anthropic) -> None:
    content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _png()}},
               {"type": "text", "text": "What color is this?"}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=SMOL, max_tokens=4, messages=[{"role": "user", "content": content}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in info.value.body["error"]["message"].lower()


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory, tiny_vision_dirs: dict[str, Path]) -> LiveServer:
    from conftest import make_store

    store = make_store(tmp_path_factory, "messages-vision", {"test/tiny-qwen3_5-vl": tiny_vision_dirs["qwen3_5_vl"]})
    server = start_server(store, store.parent / "messages-vision.log")
    yield server
    server.stop()


def test_images_on_a_vision_model(vision_server: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=vision_server.url, api_key="local", max_retries=0, timeout=300)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _png()}}
    m = client.messages.create(model="test/tiny-qwen3_5-vl", max_tokens=4, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": "What color is this?"}]}])
    counted = client.messages.count_tokens(model="test/tiny-qwen3_5-vl", messages=[
        {"role": "user", "content": [image, {"type": "text", "text": "What color is this?"}]}])
    without = client.messages.count_tokens(model="test/tiny-qwen3_5-vl", messages=[
        {"role": "user", "content": [{"type": "text", "text": "What color is this?"}]}])
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted.input_tokens > without.input_tokens


def _error(server: LiveServer, body: dict | bytes, headers: dict[str, str] | None = None,
           path: str = "/v1/messages") -> tuple[int, dict]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, timeout=60,
                   headers={"content-type": "application/json", **(headers or {})})
    return r.status_code, r.json()


def test_every_refusal_is_in_anthropics_envelope(model_server: LiveServer, client: anthropic.Anthropic) -> None:
    cases = [
        ({"model": SMOL, "messages": ASK}, 400, "max_tokens"),  # required
        ({"model": SMOL, "max_tokens": 8, "messages": ASK, "temperature": 1.5}, 400, "temperature"),
        ({"model": SMOL, "max_tokens": 8, "messages": ASK, "bogus": 1}, 400, "bogus"),
        ({"model": SMOL, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]},
         400, "document"),
        ({"model": SMOL, "max_tokens": 8, "messages": ASK,
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "web_search"),
        ({"model": SMOL, "max_tokens": 8, "messages": ASK, "container": "c1"}, 400, "container"),
        ({"model": "nope/missing", "max_tokens": 8, "messages": ASK}, 404, "not available"),
    ]
    for body, status, word in cases:
        got, envelope = _error(model_server, body)
        assert got == status, envelope
        assert envelope["type"] == "error" and set(envelope["error"]) == {"type", "message"}
        assert envelope["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
        assert word in envelope["error"]["message"], envelope
    got, envelope = _error(model_server, b"{not json")
    assert got == 400 and envelope["error"]["type"] == "invalid_request_error"
    r = httpx.get(model_server.url + "/v1/messages/batches", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # The SDK raises its own classes for them.
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ASK)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=SMOL, max_tokens=8, messages=ASK, extra_body={"top_k": -1})


def test_body_too_large_and_key_errors(tmp_path: Path, model_store: Path) -> None:
    server = start_server(model_store, tmp_path / "key.log", "smollm2", "--api-key", "sekrit")
    try:
        for headers in ({}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}):
            got, envelope = _error(server, {"model": SMOL, "max_tokens": 2, "messages": ASK}, headers)
            assert got == 401 and envelope["error"]["type"] == "authentication_error"
        keyed = anthropic.Anthropic(base_url=server.url, api_key="sekrit", max_retries=0)  # sends x-api-key
        assert keyed.messages.create(model=SMOL, max_tokens=2, messages=ASK).content
        bearer = anthropic.Anthropic(base_url=server.url, auth_token="sekrit", max_retries=0)
        assert bearer.messages.count_tokens(model=SMOL, messages=ASK).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=server.url, api_key="nope", max_retries=0).messages.create(
                model=SMOL, max_tokens=2, messages=ASK)
        big = {"model": SMOL, "max_tokens": 2, "messages": [{"role": "user", "content": "x" * (65 * 1024 * 1024)}]}
        got, envelope = _error(server, big, {"x-api-key": "sekrit"})
        assert got == 413 and envelope["error"]["type"] == "request_too_large"
    finally:
        server.stop()


def test_what_claude_code_sends_is_served(model_server: LiveServer) -> None:
    """A system message among the turns, the beta context_management that keeps earlier thinking,
    output_config's effort and adaptive thinking, and `?beta=true`, as Claude Code sends them."""
    body = {"model": SMOL, "max_tokens": 16, "stream": False, "temperature": 0,
            "system": [{"type": "text", "text": "You are terse."},
                       {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral"}}],
            "messages": [*ASK, {"role": "system", "content": "The user is in Europe."}],
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"}, "metadata": {"user_id": '{"device_id": "x"}'}}
    r = httpx.post(model_server.v1 + "/messages?beta=true", json=body, timeout=120,
                   headers={"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"})
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["type"] == "text"
    # Edits swama cannot honour are refused by the schema, naming the field.
    cleared = {**body, "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}
    r = httpx.post(model_server.v1 + "/messages", json=cleared, timeout=60)
    assert r.status_code == 400 and "context_management" in r.json()["error"]["message"]


def test_output_config_format_holds_the_answer_to_a_schema(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}
    m = client.messages.create(model=SMOL, max_tokens=48, messages=ASK, extra_body=GREEDY,
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    assert set(json.loads(m.content[0].text)) == {"capital"}
