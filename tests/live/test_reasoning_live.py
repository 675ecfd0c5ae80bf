"""Thinking apart from the answer through the OpenAI routes, with the openai SDK against the live server.

The tiny random models never write a think marker themselves: the model whose generation prompt opens
the block (Qwen3.5's form) thinks from its first token, and a budget closes the block, after which the
answer follows. The model with Qwen3's own template shows the switch reaching the template."""

from __future__ import annotations

import httpx
import openai
import pytest

from live_server import LiveServer

OPENING = "test/tiny-opening-thinker"
QWEN3 = "test/tiny-qwen3-thinking"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Is 2 less than 3?"}]
# reasoning_effort "low" allows 1024 thinking tokens: the block closes there, and the answer follows.
AFTER_LOW = 1024 + 12


@pytest.fixture(scope="module")
def client(model_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=model_server.v1, api_key="local", max_retries=0, timeout=300)


def test_chat_returns_thinking_apart(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=OPENING, messages=ASK, temperature=0, max_tokens=AFTER_LOW,
                                       reasoning_effort="low")
    message = r.choices[0].message
    thought = message.model_extra["reasoning_content"]
    assert thought and message.content and "<think>" not in message.content + thought
    assert "</think>" not in message.content + thought
    assert r.usage.completion_tokens_details.reasoning_tokens >= 1024
    assert r.choices[0].finish_reason == "length"

    # Streamed: the same thinking in delta.reasoning_content, all of it before the answer.
    kinds, thinking, answer = [], "", ""
    for chunk in client.chat.completions.create(model=OPENING, messages=ASK, temperature=0, max_tokens=AFTER_LOW,
                                                reasoning_effort="low", stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if (piece := (delta.model_extra or {}).get("reasoning_content")):
            kinds.append("thinking")
            thinking += piece
        if delta.content:
            kinds.append("answer")
            answer += delta.content
    assert (thinking, answer) == (thought, message.content)
    assert kinds.index("answer") > max(i for i, k in enumerate(kinds) if k == "thinking")


def test_chat_effort_none_and_the_template_switch_turn_thinking_off(client: openai.OpenAI,
                                                                    model_server: LiveServer) -> None:
    off = client.chat.completions.create(model=OPENING, messages=ASK, temperature=0, max_tokens=8,
                                         reasoning_effort="none")
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})
    assert off.choices[0].message.content and off.usage.completion_tokens_details is None
    # Thinking without a budget runs to max_tokens: all of it is thinking.
    on = client.chat.completions.create(model=OPENING, messages=ASK, temperature=0, max_tokens=8)
    assert on.choices[0].message.content == "" and on.choices[0].message.model_extra["reasoning_content"]
    # vLLM's form of the switch; Qwen3's template renders the closed block only when it is off.
    prompt = {}
    for switch in (True, False):
        r = httpx.post(model_server.v1 + "/chat/completions", timeout=120, json={
            "model": QWEN3, "messages": ASK, "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": switch}})
        assert r.status_code == 200, r.text
        prompt[switch] = r.json()["usage"]["prompt_tokens"]
    assert prompt[False] == prompt[True] + 4  # <think>, "\n\n", </think>, "\n\n"


def test_models_that_do_not_think_are_unaffected(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=SMOL, messages=ASK, temperature=0, max_tokens=12)
    high = client.chat.completions.create(model=SMOL, messages=ASK, temperature=0, max_tokens=12,
                                          reasoning_effort="high")
    assert plain.choices[0].message.content == high.choices[0].message.content
    assert "reasoning_content" not in (high.choices[0].message.model_extra or {})


def test_responses_reasoning_item_then_message(client: openai.OpenAI) -> None:
    r = client.responses.create(model=OPENING, input="Is 2 less than 3?", temperature=0,
                                max_output_tokens=AFTER_LOW, reasoning={"effort": "low", "summary": "auto"})
    assert [item.type for item in r.output] == ["reasoning", "message"]
    reasoning = r.output[0]
    assert reasoning.summary[0].type == "summary_text" and reasoning.summary[0].text
    assert r.output_text and r.usage.output_tokens_details.reasoning_tokens >= 1024

    # The random model never ends on its own: the stream ends in response.incomplete (max_output_tokens).
    events = list(client.responses.create(model=OPENING, input="Is 2 less than 3?", temperature=0, stream=True,
                                          max_output_tokens=AFTER_LOW, reasoning={"effort": "low"}))
    types = [event.type for event in events]
    assert types[-1] == "response.incomplete"
    final = events[-1].response
    assert final.output[0].summary[0].text == reasoning.summary[0].text
    assert final.output_text == r.output_text
    first = types.index("response.reasoning_summary_text.delta")
    assert types[first - 2:first] == ["response.output_item.added", "response.reasoning_summary_part.added"]
    closing = types.index("response.reasoning_summary_text.done")
    assert types[closing:closing + 3] == ["response.reasoning_summary_text.done",
                                          "response.reasoning_summary_part.done", "response.output_item.done"]
    assert closing < types.index("response.output_text.delta")


def test_responses_take_reasoning_items_back(client: openai.OpenAI) -> None:
    first = client.responses.create(model=OPENING, input="Is 2 less than 3?", temperature=0, max_output_tokens=6)
    assert first.output[0].type == "reasoning"
    again = client.responses.create(model=OPENING, temperature=0, max_output_tokens=6, reasoning={"effort": "none"},
                                    input=[{"role": "user", "content": "Is 2 less than 3?"},
                                           first.output[0].model_dump(exclude_none=True),
                                           {"role": "user", "content": "Sure?"}])
    assert [item.type for item in again.output] == ["message"]
