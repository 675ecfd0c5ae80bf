"""/v1/chat/completions on a live server with real SmolLM2 weights, through the official openai SDK."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import openai
import pytest

from live_server import LiveServer

SMOL = "smollm2"


@pytest.fixture(scope="module")
def client(model_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=model_server.v1, api_key="sk-local", max_retries=0, timeout=120)


def test_models_lists_installed_with_sizes(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"HuggingFaceTB/SmolLM2-135M-Instruct", "test/tiny-qwen3", "test/tiny-qwen3-thinking", "test/tiny-opening-thinker"}
    assert models["HuggingFaceTB/SmolLM2-135M-Instruct"].model_extra["size_in_bytes"] > 200_000_000


# Asked without "Answer in one word." SmolLM2's first word is a near-tie ("The" 0.08 above "L" in
# float32), which bfloat16's rounding turns into a ramble in French; asked so, "The" leads by 1.4.
ONE_WORD_QUESTION = "What is the capital of France? Answer in one word."


def test_non_streaming_answer(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=SMOL, temperature=0, max_tokens=30,
                                       messages=[{"role": "user", "content": ONE_WORD_QUESTION}])
    choice = r.choices[0]
    assert "Paris" in choice.message.content and choice.finish_reason == "stop"
    assert r.model == SMOL and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens > 10 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_answer(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=SMOL, temperature=0, max_tokens=30, stream=True,
        messages=[{"role": "system", "content": "You answer in one sentence."},
                  {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "Paris" in text
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage.completion_tokens > 0


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=SMOL, max_tokens=3, messages=[{"role": "user", "content": "Tell a story."}])
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_stop_sequences(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=SMOL, temperature=0, max_tokens=30, stop=["Paris", "paris"],
                                       messages=[{"role": "user", "content": ONE_WORD_QUESTION}])
    assert "Paris" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop"


def test_tool_round_trip(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    first = client.chat.completions.create(model=SMOL, temperature=0, max_tokens=60, tools=tools,
                                           messages=[{"role": "user", "content": "What's the weather in Paris?"}])
    assert first.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # Feed a call and its result back, as a client does after running the tool.
    second = client.chat.completions.create(model=SMOL, temperature=0, max_tokens=40, tools=tools, messages=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "It is 18 degrees and sunny."},
    ])
    replies = [first.choices[0], second.choices[0]]
    calls = [c for r in replies for c in (r.message.tool_calls or [])]
    for reply in replies:
        assert reply.message.content or reply.message.tool_calls
        assert (reply.finish_reason == "tool_calls") == bool(reply.message.tool_calls)
    # Greedy SmolLM2 calls the tool once it has seen a call in the history: parsed, typed, with an id.
    assert calls, [r.message.content for r in replies]
    for call in calls:
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == {"city": "Paris"}


@pytest.mark.parametrize(("body", "status", "fragment"), [
    ({"model": "nope/missing", "messages": [{"role": "user", "content": "x"}]}, 404, "not available locally"),
    ({"model": SMOL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400, "vision"),
    ({"model": SMOL, "messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400, "temperature"),
    ({"model": SMOL, "messages": [{"role": "user", "content": "x"}], "top_p": 2}, 400, "top_p"),
    ({"model": SMOL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "supported ranges"),
    ({"model": SMOL, "messages": [{"role": "user", "content": "x"}], "min_p": 3}, 400, "supported ranges"),
    ({"model": SMOL, "messages": [{"role": "user", "content": "x " * 400}], "context_limit": 50}, 400,
     "exceeds context limit"),
    ({"model": SMOL, "messages": []}, 400, "messages"),
    ({"model": SMOL, "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "rejected"),
    ({"model": SMOL, "messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}, 400,
     "requires JSON object arguments"),
    ({"model": "whisper-tiny", "messages": [{"role": "user", "content": "x"}]}, 404, "not available"),
])
def test_bad_requests(model_server: LiveServer, body: dict, status: int, fragment: str) -> None:
    for stream in (False, True):
        r = httpx.post(model_server.v1 + "/chat/completions", json={**body, "stream": stream}, timeout=60)
        assert r.status_code == status, r.text
        assert fragment in r.json()["error"]["message"]


def test_concurrent_clients_and_a_disconnect(model_server: LiveServer) -> None:
    url = model_server.v1 + "/chat/completions"

    def ask(model: str, n: int) -> dict:
        r = httpx.post(url, json={"model": model, "max_tokens": n, "temperature": 0,
                                  "messages": [{"role": "user", "content": "Count to ten."}]}, timeout=120)
        return r.json()

    def walk_away() -> None:
        with httpx.stream("POST", url, json={"model": SMOL, "max_tokens": 2000, "stream": True, "messages": [
                {"role": "user", "content": "Write a very long story."}]}, timeout=120) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i > 6:
                    return  # closes the connection mid-stream

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        gone = pool.submit(walk_away)
        futures = [pool.submit(ask, SMOL, 8), pool.submit(ask, SMOL, 8), pool.submit(ask, "test/tiny-qwen3", 8),
                   pool.submit(ask, "test/tiny-qwen3", 8)]
        gone.result(timeout=120)
        results = [f.result(timeout=120) for f in futures]
    assert all(r["choices"][0]["finish_reason"] in ("stop", "length") for r in results)
    # The abandoned 2000-token generation was cancelled: the model is free again well before it could finish.
    r = httpx.post(url, json={"model": SMOL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                   timeout=60)
    assert r.status_code == 200
    assert time.monotonic() - start < 60


def test_non_streaming_client_that_gives_up_frees_the_model(model_server: LiveServer) -> None:
    url = model_server.v1 + "/chat/completions"
    tiny = "test/tiny-qwen3"  # greedy random weights never emit EOS: this runs to max_tokens
    full = time.monotonic()
    httpx.post(url, timeout=120, json={"model": tiny, "max_tokens": 300, "temperature": 0,
                                       "messages": [{"role": "user", "content": "hi"}]})
    per_token = (time.monotonic() - full) / 300
    long = {"model": tiny, "max_tokens": 16_000, "temperature": 0,  # within the server's context limit of 16,384
            "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=long, timeout=httpx.Timeout(2.0, connect=5.0))
    start = time.monotonic()
    r = httpx.post(url, timeout=120, json={"model": tiny, "max_tokens": 2,
                                           "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    # The abandoned request would have run for minutes (16,000 tokens); it was cancelled instead.
    assert time.monotonic() - start < min(60, 16_000 * per_token / 4)
