"""POST /tokenize and /detokenize on a live server with real SmolLM2 weights: the tokens are the
model tokenizer's own, detokenizing gives the text back, and a chat's count is exactly the
`usage.prompt_tokens` /v1/chat/completions (and /v1/completions for a text prompt) reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from live_server import LiveServer
from swama.engine.client import EngineSettings, read

SMOL = "smollm2"
PROMPTS = ["Hello world, it's me.", "  leading spaces and a\ttab\n\nnew lines  ",
           "Übergrößenträger naïve café — 東京 😀👍🏽", "<|im_start|>user\nspecial tokens in text<|im_end|>"]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CHATS = {
    "one user turn": ([{"role": "user", "content": "What is the capital of France?"}], None),
    "system and turns": ([
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
        {"role": "assistant", "content": "Blue."},
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Another one?"}], None),
    "tools": ([{"role": "user", "content": "What's the weather in Paris?"}], TOOLS),
    "tool call history": ([
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "It is 18 degrees and sunny."}], TOOLS),
}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Any:
    """The model folder's tokenizer, loaded by transformers itself: the reference, not the server's copy."""
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def http(model_server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=model_server.url, timeout=120) as client:
        yield client


def tokenize(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/tokenize", json={"model": SMOL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def detokenize(http: httpx.Client, tokens: list[int]) -> str:
    r = http.post("/detokenize", json={"model": SMOL, "tokens": tokens})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_prompt_tokens_are_the_tokenizer_s(http: httpx.Client, tokenizer: Any, prompt: str) -> None:
    answer = tokenize(http, prompt=prompt)
    assert answer["tokens"] == tokenizer.encode(prompt)  # add_special_tokens defaults to true, as in vLLM
    assert answer["count"] == len(answer["tokens"]) and answer["token_strs"] is None
    assert answer["max_model_len"] == read(EngineSettings).context_limit
    plain = tokenize(http, prompt=prompt, add_special_tokens=False)
    assert plain["tokens"] == tokenizer.encode(prompt, add_special_tokens=False)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_detokenize_gives_the_prompt_back(http: httpx.Client, tokenizer: Any, prompt: str) -> None:
    tokens = tokenize(http, prompt=prompt)["tokens"]
    assert detokenize(http, tokens) == prompt == tokenizer.decode(tokens)


def test_token_strings_are_the_vocabulary_s(http: httpx.Client, tokenizer: Any) -> None:
    answer = tokenize(http, prompt=PROMPTS[2], return_token_strs=True)
    assert answer["token_strs"] == tokenizer.convert_ids_to_tokens(answer["tokens"])
    chat = tokenize(http, messages=CHATS["one user turn"][0], return_token_strs=True)
    assert chat["token_strs"][:3] == ["<|im_start|>", "system", "Ċ"]


def _prompt_tokens(http: httpx.Client, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    body: dict[str, Any] = {"model": SMOL, "messages": messages, "max_tokens": 1, "temperature": 0}
    if tools:
        body["tools"] = tools
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("name", CHATS)
def test_chat_count_is_the_chat_completion_s_prompt_tokens(http: httpx.Client, name: str) -> None:
    messages, tools = CHATS[name]
    body: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools else {})}
    assert tokenize(http, **body)["count"] == _prompt_tokens(http, messages, tools)


def test_chat_tokens_are_the_rendered_template(http: httpx.Client, tokenizer: Any) -> None:
    messages = CHATS["one user turn"][0]
    answer = tokenize(http, messages=messages)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert answer["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    assert detokenize(http, answer["tokens"]) == text


def test_chat_template_options(http: httpx.Client, tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Finish this: the sky is"}, {"role": "assistant", "content": "The sky is"}]
    closed = detokenize(http, tokenize(http, messages=messages, add_generation_prompt=False)["tokens"])
    assert closed == tokenizer.apply_chat_template(messages, tokenize=False)
    assert closed.endswith("The sky is<|im_end|>\n")
    opened = detokenize(http, tokenize(http, messages=messages, add_generation_prompt=False,
                                       continue_final_message=True)["tokens"])
    assert opened.endswith("<|im_start|>assistant\nThe sky is")
    # Template variables reach the template (SmolLM2's ignores this one) and change nothing else.
    with_kwargs = tokenize(http, messages=messages, chat_template_kwargs={"enable_thinking": False})
    assert with_kwargs["tokens"] == tokenize(http, messages=messages)["tokens"]


def test_text_prompt_count_is_the_completion_s_prompt_tokens(http: httpx.Client) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    if "/v1/completions" not in paths:
        pytest.skip("/v1/completions is not served yet")
    for prompt in PROMPTS:
        r = http.post("/v1/completions", json={"model": SMOL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        assert tokenize(http, prompt=prompt)["count"] == r.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize(("path", "body", "status", "message"), [
    ("/detokenize", {"model": SMOL, "tokens": [1, 49152]}, 400,
     "Token id 49152 is outside the model's vocabulary (0-49151)."),
    ("/tokenize", {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True,
                   "add_generation_prompt": True}, 400,
     "add_generation_prompt and continue_final_message cannot both be true; set add_generation_prompt to false "
     "to continue the final message."),
    ("/tokenize", {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}],
                   "chat_template_kwargs": {"add_generation_prompt": False}}, 400,
     "chat_template_kwargs may not set 'add_generation_prompt'; it is a parameter of the template call, not a "
     "variable of the template."),
    ("/tokenize", {"model": SMOL, "prompt": ""}, 400,
     "Invalid value at 'prompt': String should have at least 1 character."),
    ("/tokenize", {"model": "not-installed", "prompt": "x"}, 404, "The model is not available locally."),
])
def test_refusals(http: httpx.Client, path: str, body: dict[str, Any], status: int, message: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"] == message
