"""Speculative decoding on a live server with real SmolLM2 weights: an answer that copies its prompt
is drafted from it, and the usage of chat, completions and responses, and /metrics, say how many
drafted tokens the model accepted; an answer that copies nothing carries no such field.

The server drafts with `--speculative ngram`, which verifies every draft it finds: `auto` (the
default) drafts only while its measured pass times say a wider pass pays, which on a busy CPU
may be never, and a test of the fields needs drafts."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2_ID, served_schema_accepts

from live_server import LiveServer, start_server

pytestmark = pytest.mark.slow

SMOL = "smollm2"
# About 40 lines of Python for the model to repeat: prompt lookup finds each line in the prompt.
SOURCE = '''import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Inventory:
    """Items in a warehouse, by name, with their counts."""

    path: Path
    items: dict[str, int] = field(default_factory=dict)

    def load(self) -> None:
        if self.path.exists():
            self.items = json.loads(self.path.read_text())

    def save(self) -> None:
        self.path.write_text(json.dumps(self.items, indent=2, sort_keys=True))

    def add(self, name: str, count: int = 1) -> int:
        self.items[name] = self.items.get(name, 0) + count
        return self.items[name]

    def remove(self, name: str, count: int = 1) -> int:
        left = self.items.get(name, 0) - count
        if left < 0:
            raise ValueError(f"only {self.items.get(name, 0)} of {name} left")
        self.items[name] = left
        return left

    def total(self) -> int:
        return sum(self.items.values())


def main() -> None:
    inventory = Inventory(Path("inventory.json"))
    inventory.load()
    inventory.add("apples", 3)
    inventory.remove("apples")
    inventory.save()
    print(inventory.total())
'''
REPEAT = f"Repeat this Python file exactly as it is, with no other text:\n\n```python\n{SOURCE}```"
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def server(model_store: Path) -> Iterator[LiveServer]:
    live = start_server(model_store, model_store.parent / "draft-tokens-server.log", SMOL, "--speculative", "ngram")
    yield live
    live.stop()


def _metric(text: str, name: str, **labels: str) -> float:
    """One sample of Prometheus' text format (0 when it is not there yet); labels in sorted order."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _chat(server: LiveServer, content: str, **extra: object) -> httpx.Response:
    r = httpx.post(server.v1 + "/chat/completions", timeout=300, json={
        "model": SMOL, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r


def test_a_copied_answer_reports_its_accepted_draft_tokens_in_usage_and_metrics(server: LiveServer) -> None:
    before = httpx.get(server.url + "/metrics").text
    body = _chat(server, REPEAT, max_tokens=MAX_TOKENS).json()
    after = httpx.get(server.url + "/metrics").text
    usage = body["usage"]
    # SmolLM2 135M copies the file's head, then strays into repetitions of its own: both are drafted.
    assert body["choices"][0]["message"]["content"].startswith("```python\nimport json\nfrom dataclasses")
    accepted = usage["accepted_draft_tokens"]
    assert 0 < accepted < usage["completion_tokens"] <= MAX_TOKENS, usage
    # A copied answer drafts most of its tokens: well over one token per decode step.
    assert usage["completion_tokens"] / (usage["completion_tokens"] - accepted) > 1.5, usage
    assert served_schema_accepts("CreateChatCompletionResponse", body)

    def grew(name: str, **labels: str) -> float:
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    assert grew("swama_accepted_draft_tokens_total", model=SMOLLM2_ID) == accepted
    assert grew("swama_draft_tokens_total", model=SMOLLM2_ID) >= accepted
    assert grew("swama_decode_steps_total", model=SMOLLM2_ID, kind="speculative") > 0
    assert _metric(after, "swama_decode_steps_total", model=SMOLLM2_ID, kind="plain") >= 0
    assert grew("swama_generated_tokens_total", model=SMOLLM2_ID) == usage["completion_tokens"]


def test_the_streamed_usage_carries_it(server: LiveServer) -> None:
    with httpx.stream("POST", server.v1 + "/chat/completions", timeout=300, json={
            "model": SMOL, "messages": [{"role": "user", "content": REPEAT}], "temperature": 0,
            "max_tokens": MAX_TOKENS, "stream": True}) as r:
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    [streamed] = [c["usage"] for c in map(json.loads, lines[:-1]) if c.get("usage")]
    assert 0 < streamed["accepted_draft_tokens"] < streamed["completion_tokens"] == MAX_TOKENS
    assert served_schema_accepts("CompletionUsage", streamed)


def test_completions_and_responses_report_it_too(server: LiveServer) -> None:
    completion = httpx.post(server.v1 + "/completions", timeout=300, json={
        "model": SMOL, "prompt": f"```python\n{SOURCE}```\n\nThe same file again:\n\n```python\n",
        "temperature": 0, "max_tokens": MAX_TOKENS})
    assert completion.status_code == 200, completion.text
    usage = completion.json()["usage"]
    assert 0 < usage["accepted_draft_tokens"] < usage["completion_tokens"], usage
    response = httpx.post(server.v1 + "/responses", timeout=300, json={
        "model": SMOL, "input": REPEAT, "temperature": 0, "max_output_tokens": MAX_TOKENS})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert 0 < usage["accepted_draft_tokens"] < usage["output_tokens"], usage
    assert served_schema_accepts("ResponseUsage", usage)


@pytest.mark.parametrize("extra", [{}, {"logprobs": True}])
def test_an_answer_that_copies_nothing_has_no_draft_field(server: LiveServer, extra: dict) -> None:
    """An answer that repeats no two tokens of its prompt finds no draft ("The capital of France is"
    would: it is drafted from the question); with log probabilities a row never drafts (each token
    is recorded once). The usage is then OpenAI's own, field for field."""
    body = _chat(server, "Tell me a joke.", max_tokens=8, **extra).json()
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
