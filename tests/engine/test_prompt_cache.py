"""The multi-entry prompt cache: a conversation's next turn resumes from its own prefix, interleaved
conversations keep theirs, the byte budget evicts the least recently used, and answers do not change
(up to a step whose top two logits were a near-tie)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2_ID, make_store
from precision import BF16_NEAR_TIE, F32_LOGIT, parting, tol, top_two_gap

from live_server import LiveServer, start_server
from swama.engine.model import LoadedModel
from swama.engine.serving.loaders import load_model
from swama.engine.text.generator import ChatRequest, Finished, Sampling, TextDelta, generate, prepare
from swama.engine.text.prompt_cache import PromptCache

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> LoadedModel:
    return load_model(SMOLLM2_ID, smollm2_dir)


# The cached keys and values and a fresh prefill's are rounded apart (float32: sums in another order),
# so the replies may part where two logits, each off by its bound, are within twice it.
NEAR_TIE = tol(2 * F32_LOGIT, BF16_NEAR_TIE)  # bf16: see BF16_NEAR_TIE (a logit step of 0.125 near 25)


def _request(messages: list[dict], max_tokens: int = 12) -> ChatRequest:
    return ChatRequest(messages=messages, sampling=Sampling(temperature=0.0), max_tokens=max_tokens,
                       context_limit=4096)


def _turn(model: LoadedModel, messages: list[dict], max_tokens: int = 12) -> tuple[str, Finished]:
    text, done = [], None
    for event in generate(model, _request(messages, max_tokens), threading.Event()):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            done = event
    assert done is not None
    return "".join(text), done


def _conversation(model: LoadedModel, opening: str,
                  follow_ups: list[str]) -> Iterator[tuple[str, Finished, list[dict]]]:
    """Each turn's reply, its Finished event and the messages it answered."""
    messages = [{"role": "user", "content": opening}]
    for follow_up in [None, *follow_ups]:
        if follow_up is not None:
            messages.append({"role": "user", "content": follow_up})
        reply, done = _turn(model, messages)
        asked = list(messages)
        messages.append({"role": "assistant", "content": reply})
        yield reply, done, asked


def test_later_turns_resume_their_prefix_and_answer_as_a_full_prefill_does(smollm2: LoadedModel) -> None:
    follow_ups = ["And what about Germany?", "Which of the two is larger?"]
    smollm2.beside.set(PromptCache, None)
    cold = list(_conversation(smollm2, "What is the capital of France?", follow_ups))
    smollm2.beside.set(PromptCache, PromptCache(1 << 30))
    try:
        warm = list(_conversation(smollm2, "What is the capital of France?", follow_ups))
    finally:
        smollm2.beside.set(PromptCache, None)
    for turn, ((reply, done, asked), (warm_reply, warm_done, _)) in enumerate(zip(cold, warm, strict=True)):
        parted = parting(done.token_ids, warm_done.token_ids)
        if parted is None:
            assert warm_reply == reply
            continue
        # The turns after a parting answer different histories: the comparison ends here.
        ids = prepare(smollm2, _request(asked)).ids + list(done.token_ids[:parted])
        gap = top_two_gap(smollm2, ids)
        assert gap < NEAR_TIE, f"turn {turn} parts at token {parted} without a near-tie (gap {gap})"
        break
    assert [done.cached_tokens for _, done, _ in cold] == [0, 0, 0]
    assert warm[0][1].cached_tokens == 0
    for (_, before, _), (_, done, _) in zip(warm, warm[1:], strict=False):
        # Everything up to the previous reply is reused; only the new turn is prefilled.
        assert before.prompt_tokens <= done.cached_tokens < done.prompt_tokens


def test_interleaved_conversations_both_keep_their_prefix(smollm2: LoadedModel) -> None:
    smollm2.beside.set(PromptCache, store := PromptCache(1 << 30))
    try:
        a, b = [{"role": "user", "content": "Name a fruit."}], [{"role": "user", "content": "Name a color."}]
        openings = []
        for messages in (a, b):
            reply, done = _turn(smollm2, messages)
            openings.append(done)
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Another one?"}]
        # B shares only the chat template's opening (its system prompt) with A, and A's entry stays whole.
        assert openings[0].cached_tokens == 0 and 0 < openings[1].cached_tokens < openings[1].prompt_tokens - 3
        for messages, opening in zip((a, b), openings, strict=True):  # A's second turn, then B's
            _, done = _turn(smollm2, messages)
            assert done.cached_tokens >= opening.prompt_tokens  # each found its own conversation
        assert len(store) == 2
    finally:
        smollm2.beside.set(PromptCache, None)


def test_the_byte_budget_evicts_the_least_recently_used(smollm2: LoadedModel) -> None:
    smollm2.beside.set(PromptCache, store := PromptCache(1 << 30))
    try:
        _turn(smollm2, [{"role": "user", "content": "Name a fruit."}], max_tokens=4)
        one = store.nbytes
        store.budget = int(one * 1.5)  # room for one entry of this size, not two
        _turn(smollm2, [{"role": "user", "content": "Name a color."}], max_tokens=4)
        assert len(store) == 1 and store.nbytes <= store.budget
        _, done = _turn(smollm2, [{"role": "user", "content": "Name a color."}], max_tokens=4)
        assert done.cached_tokens > 5  # the newer entry stayed
    finally:
        smollm2.beside.set(PromptCache, None)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[LiveServer]:
    root = make_store(tmp_path_factory, "prompt-cache-store", {SMOLLM2_ID: smollm2_dir})
    live = start_server(root, root.parent / "prompt-cache.log")
    yield live
    live.stop()


def test_usage_reports_the_cached_tokens_on_chat_and_responses(server: LiveServer) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    first = httpx.post(server.v1 + "/chat/completions", timeout=120,
                       json={"model": "smollm2", "messages": messages, "max_tokens": 6, "temperature": 0}).json()
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Again."}]
    second = httpx.post(server.v1 + "/chat/completions", timeout=120,
                        json={"model": "smollm2", "messages": messages, "max_tokens": 6, "temperature": 0}).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    r = httpx.post(server.v1 + "/responses", timeout=120, json={
        "model": "smollm2", "max_output_tokens": 6, "input": [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            {"role": "user", "content": "Again."}]}).json()
    assert r["usage"]["input_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]


# The shape of a Codex CLI turn: long shared instructions and tools, then the session's own messages.
CODEX_INSTRUCTIONS = "You are Codex, a coding agent working in the user's repository.\n" + "\n".join(
    f"Rule {i}: read file number {i} before changing it, and say which test covers the change." for i in range(60))
CODEX_TOOLS = [{"type": "function", "name": name, "description": f"Run {name}.", "strict": False,
                "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"],
                               "additionalProperties": False}}
               for name in ("exec_command", "write_stdin", "view_image")]


def _codex_turn(server: LiveServer, items: list[dict]) -> tuple[dict, list[dict]]:
    """One streamed Codex-style turn: its usage and the items that answered it."""
    body = {"model": "smollm2", "instructions": CODEX_INSTRUCTIONS, "input": items, "tools": CODEX_TOOLS,
            "tool_choice": "auto", "store": False, "stream": True, "max_output_tokens": 8, "temperature": 0}
    final = None
    with httpx.stream("POST", server.v1 + "/responses", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            event = json.loads(line[6:]) if line.startswith("data: ") else {}
            if event.get("type") in ("response.completed", "response.incomplete"):  # 8 tokens may cut it short
                final = event["response"]
    assert final is not None
    return final["usage"], [item for item in final["output"] if item["type"] == "message"]


def _hit_tokens(server: LiveServer) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("swama_prompt_cache_hit_tokens_total{"))


def test_two_codex_sessions_interleaved_on_one_model_both_hit_the_cache(server: LiveServer) -> None:
    """Session A's turn, session B's, then each one's next turn: every later turn resumes from its own
    session's entry (B's first turn from the shared instructions A left), through the batch scheduler."""
    sessions = {name: [{"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": f"Fix the failing test in module {name}."}]}]
                for name in ("alpha", "beta")}
    before = _hit_tokens(server)
    first: dict[str, dict] = {}
    for name, items in sessions.items():
        first[name], output = _codex_turn(server, items)
        items += output + [{"type": "message", "role": "user",
                            "content": [{"type": "input_text", "text": "Now run the tests."}]}]
    shared = first["beta"]["input_tokens_details"]["cached_tokens"]
    # B's first turn reused the instructions and tools A had read, not A's own message.
    assert shared > 600 and shared < first["beta"]["input_tokens"] - 5, first
    later = {name: _codex_turn(server, items)[0] for name, items in sessions.items()}
    for name in sessions:  # A's second turn ran after B's first, and still found A's whole first turn
        assert later[name]["input_tokens_details"]["cached_tokens"] >= first[name]["input_tokens"], (name, later)
    reused = shared + sum(u["input_tokens_details"]["cached_tokens"] for u in later.values())
    reused += first["alpha"]["input_tokens_details"]["cached_tokens"]
    assert _hit_tokens(server) - before == reused
