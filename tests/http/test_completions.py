"""POST /v1/completions in-process, over a fake engine that keeps the door's contract (raw prompts,
Logprobs before their text, stop sequences cut, prompt scoring): validation, wording, the
text_completion shape, choice order, echo, logprobs, streaming and its errors. The real model is
driven in tests/live/test_completions_live.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import served_schema_accepts, stated_handler_rule
from fastapi.testclient import TestClient

from swama.engine.client import (
    BadInput,
    ChatRequest,
    Finished,
    InstalledModel,
    Logprobs,
    NotFound,
    TextDelta,
    TokenLogprob,
    TopLogprob,
)
from swama.generated import openai_models as om
from swama.handlers.http.app import create_app
from swama.handlers.http.settings import ServerSettings

MODEL = "fake/model"
FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit " * 8
VOCAB = 0x110000  # token id = a Unicode code point: one character per token


def _entry(token_id: int, top: int, context: int) -> TokenLogprob:
    """A deterministic logprob for `token_id` after `context` tokens; `top` alternatives, most probable first."""
    text = chr(token_id)
    alts = tuple(TopLogprob(ord(c), c, -0.05 * (k + 1), tuple(c.encode())) for k, c in enumerate("etaoinshrdlucmfwyp"[:top]))
    return TokenLogprob(token_id, text, -0.1 - (token_id + context) % 7 / 10, tuple(text.encode()), alts)


class FakeEngine:
    """What the route asks of the engine, with a one-character-per-token tokenizer."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []
        self.scored: list[list[int]] = []
        self.running = self.most_running = 0
        self.fail_after: int | None = None  # raise after this many events of a generation

    def model_for(self, name: str, task: Any) -> InstalledModel:
        if name != MODEL:
            raise NotFound(f"Model '{name}' is not available locally.", code="model_not_found")
        return InstalledModel(MODEL, Path("."), 0, 0)

    async def tokenize_prompt(self, model_id: str, prompt: str | list[int]) -> list[int]:
        ids = [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)
        bad = [t for t in ids if not 0 <= t < VOCAB]
        if bad:
            raise BadInput(f"Token id {bad[0]} is outside the model's vocabulary (0-{VOCAB - 1}).")
        if not ids:
            raise BadInput("The prompt is empty: it needs at least one token.")
        return ids

    async def score_prompt(self, model_id: str, ids: list[int], top: int = 0,
                           temperature: float = 1.0) -> list[TokenLogprob]:
        self.scored.append(list(ids))
        first = chr(ids[0])
        return [TokenLogprob(ids[0], first, None, tuple(first.encode()))] + [
            _entry(t, top, i) for i, t in enumerate(ids[1:], 1)]

    async def chat(self, model_id: str, request: ChatRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        ids = await self.tokenize_prompt(model_id, request.prompt)
        prompt = "".join(map(chr, ids))
        seed = "" if request.sampling.seed is None else f"#{request.sampling.seed}"
        text = (f"[{prompt}{seed}] " + FILLER)[: request.max_tokens]
        hits = [(text.find(s), s) for s in request.stop if s and s in text]
        cut, reason = len(text), "length"
        if hits:
            at, stop = min(hits)
            cut, text, reason = at, text[: at + len(stop)], "stop"
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            for k, c in enumerate(text):
                await asyncio.sleep(0)
                if self.fail_after is not None and k >= self.fail_after:
                    raise BadInput("The fake engine failed.")
                if request.logprobs is not None:
                    yield Logprobs((_entry(ord(c), request.logprobs, len(ids) + k),))
                if k < cut:  # a stop sequence's own text is never sent; its tokens' logprobs were
                    yield TextDelta(c)
            yield Finished(reason, len(ids), len(text), 0.0, 0.0)
        finally:
            self.running -= 1


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("SWAMA_MODELS", str(tmp_path))
    app = create_app(ServerSettings(batch_rows=3, ui=False))
    app.state.engine = engine
    yield TestClient(app, base_url="http://localhost")  # no lifespan: the real engine behind create_app is never started


def post(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", **body})


def ok(client: TestClient, **body: Any) -> dict[str, Any]:
    r = post(client, **body)
    assert r.status_code == 200, r.text
    data = r.json()
    om.CreateCompletionResponse.model_validate(data)
    assert served_schema_accepts("CreateCompletionResponse", data)
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-") and data["model"] == MODEL
    return data


def events(client: TestClient, **body: Any) -> list[Any]:
    with client.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "Hello", "stream": True,
                                                         **body}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = "".join(r.iter_text())
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames) and frames[-1] == "data: [DONE]"
    out = [json.loads(f[len("data: "):]) for f in frames[:-1]]
    for chunk in out:
        if "error" not in chunk:
            assert served_schema_accepts("CreateCompletionResponse", chunk), chunk
    return out


# -- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "param", "fragment"), [
    ({"suffix": "end"}, "suffix", "'suffix' is not supported by this server"),
    ({"logit_bias": {"50256": -100}}, "logit_bias", "'logit_bias' is not supported by this server"),
    ({"logprobs": 21}, "logprobs", "between 0 and 20 on this server (OpenAI allows up to 5)"),
    ({"logprobs": -1}, "logprobs", "between 0 and 20"),
    ({"max_tokens": -1}, "max_tokens", "outside their supported ranges"),
    ({"prompt": ""}, "prompt", "'prompt' must be a non-empty string"),
    ({"prompt": []}, "prompt", "'prompt' must be"),
    ({"prompt": [[]]}, "prompt", "'prompt' must be"),
    ({"prompt": ["a", 1]}, "prompt", "'prompt' must be"),
    ({"prompt": [-1]}, "prompt", "'prompt' must be"),
    ({"prompt": None}, "prompt", "'prompt' must be"),
    ({"n": 0}, "n", "Invalid value"),
    ({"temperature": 3}, "temperature", "Invalid value"),
    ({"stop": ["x"] * 17}, "stop", "Invalid value"),
    ({"stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation", "Unknown field"),
    ({"brand_new": 1}, "brand_new", "'brand_new' is not supported by this server"),
])
def test_schema_refusals_are_worded_by_field(client: TestClient, engine: FakeEngine, body: dict, param: str,
                                             fragment: str) -> None:
    r = post(client, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert fragment in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"
    assert not engine.requests


def test_a_missing_prompt_is_named(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": MODEL})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize(("body", "param"), [
    ({"max_tokens": 0}, "max_tokens"),
    ({"best_of": 2}, "best_of"),
    ({"best_of": 1, "n": 2}, "best_of"),
    ({"prompt": [VOCAB]}, None),
    ({"prompt": [[1, 2], [VOCAB + 5]], "echo": True, "max_tokens": 0}, None),
])
def test_handler_rules_are_stated_in_the_document(client: TestClient, body: dict, param: str | None) -> None:
    for stream in (False, True):
        r = post(client, stream=stream, **body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param
        assert stated_handler_rule("createCompletion", error["message"]), error["message"]


def test_an_unknown_model_is_a_404(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_accepted_no_op_values(client: TestClient) -> None:
    ok(client, logit_bias={}, best_of=2, n=2, user="u-1", echo=False, stream=False, logprobs=None, stop=None,
       max_tokens=None, stream_options=None)


# -- the object --------------------------------------------------------------------------------

def test_a_string_prompt(client: TestClient, engine: FakeEngine) -> None:
    data = ok(client, max_tokens=12, temperature=0.5, top_p=0.9, presence_penalty=0.1, frequency_penalty=0.2,
              seed=7, stop="zz")
    assert data["choices"] == [{"text": "[Hello#7] lo", "index": 0, "logprobs": None, "finish_reason": "length"}]
    assert data["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}
    (request,) = engine.requests
    assert request.prompt == "Hello" and request.messages == [] and request.max_tokens == 12
    assert request.stop == ["zz"] and request.logprobs is None
    s = request.sampling
    assert (s.temperature, s.top_p, s.presence_penalty, s.frequency_penalty, s.seed) == (0.5, 0.9, 0.1, 0.2, 7)


def test_max_tokens_defaults_to_16(client: TestClient, engine: FakeEngine) -> None:
    data = ok(client)
    assert engine.requests[0].max_tokens == 16 and data["usage"]["completion_tokens"] == 16


def test_choices_follow_openai_order(client: TestClient, engine: FakeEngine) -> None:
    """Prompt i's n choices sit at indices i*n .. i*n+n-1; a seed moves on by one per choice."""
    data = ok(client, prompt=["ab", "cd", "ef"], n=2, seed=10, max_tokens=8)
    texts = [c["text"] for c in data["choices"]]
    assert [c["index"] for c in data["choices"]] == list(range(6))
    assert texts == ["[ab#10] ", "[ab#11] ", "[cd#10] ", "[cd#11] ", "[ef#10] ", "[ef#11] "]
    # Each prompt's tokens count once, however many choices continue it.
    assert data["usage"] == {"prompt_tokens": 6, "completion_tokens": 48, "total_tokens": 54}


def test_token_prompts(client: TestClient, engine: FakeEngine) -> None:
    one = ok(client, prompt=[72, 105], max_tokens=4)
    assert one["choices"][0]["text"] == "[Hi]" and engine.requests[0].prompt == [72, 105]
    many = ok(client, prompt=[[72], [105, 106]], max_tokens=5)
    assert [c["text"] for c in many["choices"]] == ["[H] l", "[ij] "]


def test_generations_are_bounded_per_request(client: TestClient, engine: FakeEngine) -> None:
    """More choices than a batch queue in the route instead of being refused by the engine's admission."""
    data = ok(client, prompt=[f"p{i}" for i in range(7)], n=2, max_tokens=6)
    assert len(data["choices"]) == 14 and engine.most_running <= 3


def test_stop_sequences_cut_the_text_and_its_logprobs(client: TestClient) -> None:
    data = ok(client, prompt="Hi", stop=["ipsum", "never"], logprobs=2, max_tokens=40)
    choice = data["choices"][0]
    assert choice["text"] == "[Hi] lorem " and choice["finish_reason"] == "stop"
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [2 + k for k in range(len(choice["text"]))]  # counted from the prompt's start
    assert data["usage"]["completion_tokens"] == len("[Hi] lorem ipsum")


def test_logprobs_of_generated_tokens(client: TestClient) -> None:
    data = ok(client, prompt="Hi", logprobs=3, max_tokens=5)
    lp = data["choices"][0]["logprobs"]
    assert lp["tokens"] == list("[Hi] ")
    assert lp["text_offset"] == [2, 3, 4, 5, 6]
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        # The k alternatives, most probable first, and the chosen token (OpenAI: up to logprobs+1).
        assert list(top)[:3] == ["e", "t", "a"] and top[token] == value
    zero = ok(client, prompt="Hi", logprobs=0, max_tokens=2)["choices"][0]["logprobs"]
    assert zero["top_logprobs"] == [{t: v} for t, v in zip(zero["tokens"], zero["token_logprobs"], strict=True)]


def test_echo_puts_the_prompt_first(client: TestClient, engine: FakeEngine) -> None:
    data = ok(client, prompt="Hey", echo=True, max_tokens=3)
    assert data["choices"][0]["text"] == "Hey[He" and not engine.scored  # a text prompt is echoed as sent
    tokens = ok(client, prompt=[72, 105], echo=True, max_tokens=3)
    assert tokens["choices"][0]["text"] == "Hi[Hi"  # token ids are echoed as their text


def test_echo_with_logprobs_scores_the_prompt(client: TestClient, engine: FakeEngine) -> None:
    data = ok(client, prompt="Hey", echo=True, logprobs=1, max_tokens=2)
    lp = data["choices"][0]["logprobs"]
    assert data["choices"][0]["text"] == "Hey[H"
    assert lp["tokens"] == ["H", "e", "y", "[", "H"] and lp["text_offset"] == [0, 1, 2, 3, 4]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:3] == [_entry(ord("e"), 1, 1).logprob, _entry(ord("y"), 1, 2).logprob]
    assert lp["top_logprobs"][1] == {"e": -0.05}
    assert [72, 101, 121] in engine.scored


def test_max_tokens_0_with_echo_scores_the_prompt_alone(client: TestClient, engine: FakeEngine) -> None:
    data = ok(client, prompt=[[72, 105, 33], [104]], echo=True, logprobs=0, max_tokens=0, n=2)
    assert not engine.requests  # nothing is generated
    first, _, last, _ = data["choices"]
    assert first["text"] == "Hi!" and first["finish_reason"] == "length"
    assert first["logprobs"]["tokens"] == ["H", "i", "!"]
    assert first["logprobs"]["token_logprobs"][1:] == [_entry(105, 0, 1).logprob, _entry(33, 0, 2).logprob]
    assert last["text"] == "h" and last["logprobs"]["token_logprobs"] == [None]
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4}


def test_multibyte_text_offsets_count_characters(client: TestClient) -> None:
    data = ok(client, prompt="é€", echo=True, logprobs=0, max_tokens=0)
    assert data["choices"][0]["logprobs"]["text_offset"] == [0, 1]


# -- streams -----------------------------------------------------------------------------------

def test_a_stream_has_the_object_s_text(client: TestClient) -> None:
    body = {"prompt": ["ab", "cd"], "n": 2, "max_tokens": 6, "logprobs": 1, "echo": True, "seed": 3}
    whole = ok(client, **body)
    chunks = events(client, **body)
    texts = ["" for _ in range(4)]
    finish: list[str | None] = [None] * 4
    tokens: list[list[str]] = [[] for _ in range(4)]
    for chunk in chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        tokens[choice["index"]] += choice["logprobs"]["tokens"]
        finish[choice["index"]] = choice["finish_reason"] or finish[choice["index"]]
    assert texts == [c["text"] for c in whole["choices"]]
    assert tokens == [c["logprobs"]["tokens"] for c in whole["choices"]]
    assert finish == ["length"] * 4
    assert all("usage" not in c for c in chunks)


def test_a_stream_ends_with_usage_when_asked(client: TestClient) -> None:
    chunks = events(client, max_tokens=4, stream_options={"include_usage": True})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4,
                                                                   "total_tokens": 9}
    assert chunks[0]["choices"][0]["finish_reason"] is None and chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_a_failure_mid_stream_is_an_error_event(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_after = 2
    chunks = events(client, max_tokens=8)
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["[", "H"]
    assert chunks[-1]["error"]["message"] == "The fake engine failed."
    assert om.ErrorResponse.model_validate(chunks[-1])


def test_a_failure_before_the_first_chunk_is_a_plain_error(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_after = 0
    r = post(client, stream=True)
    assert r.status_code == 400 and r.json()["error"]["message"] == "The fake engine failed."
