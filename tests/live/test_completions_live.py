"""/v1/completions on a live server with real SmolLM2 weights, through the official openai SDK:
string, list and token prompts, n, streams, stop sequences, echo with logprobs, a prompt scored
alone (max_tokens 0) against a direct mlx-lm forward pass, and seeded sampling."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from precision import BF16_LOGIT_STEP, DTYPE, F32_LOGPROB, tol

from live_server import LiveServer

SMOL = "smollm2"
PROMPT = "The capital of France is"
# A prompt's log probabilities against a forward pass in this process: the same weights and dtype, the
# server's prefill in another summation order. bf16: two computations of SmolLM2's logits may round
# four steps apart.
LOGPROB_BOUND = tol(F32_LOGPROB, 4 * BF16_LOGIT_STEP)


@pytest.fixture(scope="module")
def client(model_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=model_server.v1, api_key="sk-local", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(smollm2_dir: Path) -> tuple[Any, Any]:
    """SmolLM2 loaded by mlx-lm itself from the folder the server serves."""
    from mlx_lm import load

    model, tokenizer = load(str(smollm2_dir))
    model.set_dtype(DTYPE)
    return model, tokenizer


def direct_logprobs(model: Any, ids: list[int]) -> list[float]:
    """Each token's log probability given the ones before it, from one forward pass."""
    import mlx.core as mx

    logits = model(mx.array([ids]))[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.take_along_axis(lp[:-1], mx.array(ids[1:])[:, None], axis=-1)[:, 0].tolist()


def test_a_string_prompt(client: openai.OpenAI) -> None:
    r = client.completions.create(model=SMOL, prompt=PROMPT, max_tokens=8, temperature=0)
    (choice,) = r.choices
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == SMOL
    assert "Paris" in choice.text and choice.index == 0 and choice.logprobs is None
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == 5 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_the_text_is_its_tokens_text(client: openai.OpenAI) -> None:
    """A raw continuation keeps the first token's leading space (a chat reply's detokenizer drops it)."""
    r = client.completions.create(model=SMOL, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=0)
    assert r.choices[0].logprobs.tokens == [" Paris"] and r.choices[0].text == " Paris"


def test_prompts_and_n_give_choices_in_openai_order(client: openai.OpenAI) -> None:
    prompts = [PROMPT, "One, two, three,"]
    r = client.completions.create(model=SMOL, prompt=prompts, n=2, max_tokens=6, temperature=0.8, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    alone = [client.completions.create(model=SMOL, prompt=p, max_tokens=6, temperature=0.8, seed=5).choices[0].text
             for p in prompts]
    # Choice 0 of each prompt is what the prompt alone gives with the same seed.
    assert [r.choices[0].text, r.choices[2].text] == alone
    greedy = client.completions.create(model=SMOL, prompt=prompts, max_tokens=6, temperature=0)
    assert "Paris" in greedy.choices[0].text and "four" in greedy.choices[1].text.lower()


def test_token_prompts_read_as_their_text(client: openai.OpenAI, reference: tuple[Any, Any]) -> None:
    ids = reference[1].encode(PROMPT)
    text = client.completions.create(model=SMOL, prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text
    one = client.completions.create(model=SMOL, prompt=ids, max_tokens=6, temperature=0)
    many = client.completions.create(model=SMOL, prompt=[ids, ids[:3]], max_tokens=6, temperature=0)
    assert one.choices[0].text == text == many.choices[0].text and one.usage.prompt_tokens == len(ids)
    assert len(many.choices) == 2 and many.usage.prompt_tokens == len(ids) + 3


def test_a_stream_gives_the_same_text(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=SMOL, prompt=PROMPT, max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model=SMOL, prompt=PROMPT, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_sequences(client: openai.OpenAI) -> None:
    r = client.completions.create(model=SMOL, prompt=PROMPT, max_tokens=10, temperature=0, stop=["Paris"],
                                  logprobs=1)
    choice = r.choices[0]
    assert "Paris" not in choice.text and choice.finish_reason == "stop"
    # The tokens spell the text; the one that completes the stop sequence (" Paris" here, whose space
    # is text) may be listed, later ones are not.
    joined = "".join(choice.logprobs.tokens)
    assert joined.startswith(choice.text) and joined[len(choice.text):] in ("", "Paris")


def test_echo_with_logprobs(client: openai.OpenAI, reference: tuple[Any, Any]) -> None:
    ids = reference[1].encode(PROMPT)
    r = client.completions.create(model=SMOL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=2)
    choice = r.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT) and len(lp.tokens) == len(ids) + r.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[len(ids)] == len(PROMPT)
    for value, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
        assert value <= 0 and 2 <= len(top) <= 3 and max(top.values()) >= value
    # Greedy: each generated token is its step's most probable.
    for token, value, top in zip(lp.tokens[len(ids):], lp.token_logprobs[len(ids):], lp.top_logprobs[len(ids):],
                                 strict=True):
        assert top[token] == value == max(top.values())


def test_max_tokens_0_scores_the_prompt_like_a_forward_pass(client: openai.OpenAI,
                                                            reference: tuple[Any, Any]) -> None:
    model, tokenizer = reference
    text = "Paris is the capital and largest city of France. It is known for the Eiffel Tower."
    ids = tokenizer.encode(text)
    expected = direct_logprobs(model, ids)
    for prompt in (text, ids):
        r = client.completions.create(model=SMOL, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
        choice = r.choices[0]
        lp = choice.logprobs
        assert choice.text == text and choice.finish_reason == "length"
        assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
        assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids)
        worst = max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], expected, strict=True))
        assert worst <= LOGPROB_BOUND, worst
        assert math.isclose(sum(lp.token_logprobs[1:]), sum(expected), abs_tol=len(ids) * LOGPROB_BOUND)


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[str]:
        r = client.completions.create(model=SMOL, prompt="Once upon a time", max_tokens=12, temperature=1.0,
                                      seed=seed, n=2)
        return [c.text for c in r.choices]

    # The two choices join the batch together every time (engine/serving/siblings.py): a row's logits
    # depend in their last bits on the rows beside it, so a choice run alone once would part.
    first = sample(1234)
    for _ in range(3):
        assert sample(1234) == first
    assert first[0] != first[1]  # choice j samples with seed + j


@pytest.mark.parametrize(("body", "status", "fragment"), [
    ({"prompt": "x", "suffix": "y"}, 400, "'suffix' is not supported"),
    ({"prompt": "x", "max_tokens": 0}, 400, "unless 'echo' is true"),
    ({"prompt": [10 ** 9]}, 400, "outside the model's vocabulary"),
    ({"prompt": "x " * 400, "max_tokens": 0, "echo": True, "logprobs": 0}, 200, ""),
    ({"model": "nope/missing", "prompt": "x"}, 404, "not available locally"),
])
def test_refusals(model_server: LiveServer, body: dict, status: int, fragment: str) -> None:
    for stream in (False, True):
        r = httpx.post(model_server.v1 + "/completions", json={"model": SMOL, **body, "stream": stream}, timeout=60)
        assert r.status_code == status, r.text
        if status != 200:
            assert fragment in r.json()["error"]["message"]
