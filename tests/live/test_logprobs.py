"""Log probabilities on a live server, through the openai SDK, against a direct forward pass.

The reference is mlx-lm's own SmolLM2 run in this process on the same weights and dtype: the prompt
the chat template renders plus the generated tokens, one forward pass, log-softmax of the logits at
the request's temperature. The server's values, computed step by step, must equal it within
LOGPROB_BOUND: the same logits in another summation order.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import mlx.core as mx
import openai
import pytest
from precision import BF16_LOGIT_STEP, F32_LOGPROB, tol

from live_server import LiveServer

SMOL = "smollm2"
QUESTION = [{"role": "user", "content": "Name three colors of the rainbow."}]
# Two computations of SmolLM2's log probabilities in another summation order (the server's cached
# decode steps against one forward pass); bf16: its logits may round four steps apart.
LOGPROB_BOUND = tol(F32_LOGPROB, 4 * BF16_LOGIT_STEP)


@pytest.fixture(scope="module")
def client(model_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=model_server.v1, api_key="sk-local", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(smollm2_dir: Path) -> tuple[Any, Any]:
    from mlx_lm import load

    return load(str(smollm2_dir))


def _direct(reference: tuple[Any, Any], messages: list[dict[str, Any]], generated: list[int],
            temperature: float) -> Any:
    """Log-probabilities of every generated position from one forward pass (float32)."""
    model, tokenizer = reference
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    logits = model(mx.array([prompt + generated]))[0, len(prompt) - 1: len(prompt) - 1 + len(generated)]
    x = logits.astype(mx.float32)
    if temperature > 0:
        x = x / temperature
    return x - mx.logsumexp(x, axis=-1, keepdims=True), len(prompt)


def _ids(reference: tuple[Any, Any], entries: list[Any]) -> list[int]:
    """Token ids from the tokens' bytes (each token's bytes are exact, so the vocabulary maps them back)."""
    _, tokenizer = reference
    by_bytes = _bytes_table(tokenizer)
    return [by_bytes[bytes(e.bytes)] for e in entries]


def _bytes_table(tokenizer: Any) -> dict[bytes, int]:
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tokenizer._tokenizer)
    return {ll.decode_bytes([i]): i for i in range(ll.vocab_size) if not ll.is_special_token(i)}


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_equal_a_direct_forward_pass(client: openai.OpenAI, reference: tuple[Any, Any],
                                               temperature: float) -> None:
    r = client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=24, temperature=temperature,
                                       seed=5, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    # The tokens spell the text (the detokenizer drops a leading space the first token may carry).
    assert "".join(e.token for e in content).removeprefix(" ") == r.choices[0].message.content.removeprefix(" ")
    generated = _ids(reference, content)
    direct, prompt_tokens = _direct(reference, QUESTION, generated, temperature)
    assert prompt_tokens == r.usage.prompt_tokens
    bound = LOGPROB_BOUND / (temperature or 1)  # logits divided by the temperature, their moves with them
    for i, entry in enumerate(content):
        assert abs(entry.logprob - direct[i, generated[i]].item()) < bound, (i, entry.token)
        tops = entry.top_logprobs
        assert len(tops) == 5 and [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        best = mx.sort(direct[i])[-5:][::-1].tolist()
        assert all(abs(t.logprob - b) < bound for t, b in zip(tops, best, strict=True))
        assert all(bytes(t.bytes).decode("utf-8", errors="replace") == t.token for t in tops)
    if temperature == 0:  # greedy: each token is its position's most probable one
        assert all(e.token == e.top_logprobs[0].token for e in content)


def test_streamed_logprobs_match(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=20, temperature=0,
                                           logprobs=True, top_logprobs=2)
    streamed = []
    for chunk in client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=20, temperature=0,
                                                logprobs=True, top_logprobs=2, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    # The same request alone again (its prompt now cached) computes the same values: measured equal.
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [
        (e.token, round(e.logprob, 5)) for e in whole.choices[0].logprobs.content]
    assert all(len(e.top_logprobs) == 2 for e in streamed)


def test_no_logprobs_unless_asked(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True)
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)


def test_top_logprobs_bounds(client: openai.OpenAI) -> None:
    for bad in ({"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 3}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=4, **bad)
    r = client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=3, temperature=0,
                                       logprobs=True, top_logprobs=20)
    assert all(len(e.top_logprobs) == 20 for e in r.choices[0].logprobs.content)


def test_responses_include_logprobs(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model=SMOL, messages=QUESTION, max_tokens=12, temperature=0,
                                          logprobs=True, top_logprobs=3)
    r = client.responses.create(model=SMOL, input=QUESTION[0]["content"], max_output_tokens=12, temperature=0,
                                include=["message.output_text.logprobs"], top_logprobs=3)
    part = r.output[0].content[0]
    # The same prompt alone: the same values (measured equal).
    assert [(e.token, round(e.logprob, 5)) for e in part.logprobs] == [
        (e.token, round(e.logprob, 5)) for e in chat.choices[0].logprobs.content]
    assert all(len(e.top_logprobs) == 3 for e in part.logprobs)
    assert r.top_logprobs == 3
    events = list(client.responses.create(model=SMOL, input=QUESTION[0]["content"], max_output_tokens=12,
                                          temperature=0, include=["message.output_text.logprobs"], stream=True))
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [d.token for d in deltas] == [e.token for e in part.logprobs]
    assert all(math.isfinite(d.logprob) for d in deltas)
