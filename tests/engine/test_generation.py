"""The generator's parts: tool-call splitting, stop sequences, prompts and trimming, the pool."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from swama.engine.errors import EngineError, NotFound
from swama.engine.files.store import ModelStore
from swama.engine.serving.pool import ModelPool
from swama.engine.settings import EngineSettings
from swama.engine.text.chat_prompt import build_prompt, template_renders_tools
from swama.engine.text.generator import (
    ChatRequest,
    Finished,
    Sampling,
    TextDelta,
    ToolCallEvent,
    _StopMatcher,
    generate,
)
from swama.engine.text.language import load_language_model
from swama.engine.text.tool_calls import DEFAULT_FORMAT, ToolCallSplitter


def feed_all(splitter: ToolCallSplitter, pieces: list[str]) -> tuple[str, list]:
    text, calls = "", []
    for piece in pieces:
        t, c = splitter.feed(piece)
        text += t
        calls += c
    t, c = splitter.finish()
    return text + t, calls + c


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_splitter_finds_calls_across_any_chunking(size: int) -> None:
    raw = ('Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
           '<tool_call>{"name": "t2", "arguments": "{\\"a\\": 1}"}</tool_call>')
    text, calls = feed_all(ToolCallSplitter(DEFAULT_FORMAT), [raw[i:i + size] for i in range(0, len(raw), size)])
    assert text == "Let me check.\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                  ("t2", {"a": 1})]
    assert all(c.id.startswith("call_") for c in calls)


def test_splitter_keeps_broken_calls_as_text() -> None:
    text, calls = feed_all(ToolCallSplitter(DEFAULT_FORMAT), ["a <tool_call>not json</tool_call> b <tool"])
    assert calls == [] and text == "a <tool_call>not json</tool_call> b <tool"
    text, calls = feed_all(ToolCallSplitter(DEFAULT_FORMAT), ['<tool_call>{"name": "x", "arguments": {}}'])
    assert text == "" and [c.name for c in calls] == ["x"]  # an unterminated block that parses is a call


def test_stop_matcher_holds_back_partial_stops() -> None:
    m = _StopMatcher(["END", "\n\n"])
    assert m.feed("hello E") == ("hello ", False)
    assert m.feed("N") == ("", False)
    assert m.feed("Dtail") == ("", True)
    m = _StopMatcher(["END"])
    assert m.feed("EN") == ("", False)
    assert m.feed("X") == ("ENX", False)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path):
    return load_language_model("smollm2", smollm2_dir)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path):
    return load_language_model("tiny", tiny_model_dir)


def test_prompt_and_trimming_on_the_real_template(smollm2) -> None:
    tok = smollm2.tokenizer
    assert not template_renders_tools(tok)  # SmolLM2's template has no tool section
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "old question " * 200},
            {"role": "assistant", "content": "old answer " * 200},
            {"role": "user", "content": "What is 2+2?"}]
    full = build_prompt(tok, msgs, None, 16384, native_tools=False)
    assert full.text.endswith("<|im_start|>assistant\n") and not full.trimmed
    trimmed = build_prompt(tok, msgs, None, 300, native_tools=False)
    assert trimmed.trimmed and len(trimmed.ids) < 300
    assert "Be brief." in trimmed.text and "What is 2+2?" in trimmed.text
    with pytest.raises(EngineError, match=r"Prompt still exceeds context limit \(\d+ > 20\) after trimming."):
        build_prompt(tok, msgs, None, 20, native_tools=False)


def test_tool_calls_round_trip_through_the_template(smollm2) -> None:
    """An assistant tool call rendered into the history parses back into the same call."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    prompt = build_prompt(smollm2.tokenizer, msgs, tools, 16384, native_tools=False)
    assert '"name": "get_weather"' in prompt.text and "18 C, sunny" in prompt.text
    rendered_call = prompt.text[prompt.text.index("<tool_call>"):]
    _, calls = feed_all(ToolCallSplitter(DEFAULT_FORMAT), [rendered_call])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def run_all(model, request: ChatRequest) -> list:
    return list(generate(model, request, threading.Event()))


def test_generation_events_and_limits(tiny) -> None:
    events = run_all(tiny, ChatRequest(messages=[{"role": "user", "content": "hi"}],
                                       sampling=Sampling(temperature=0), max_tokens=5))
    done = events[-1]
    assert isinstance(done, Finished) and done.finish_reason == "length" and done.completion_tokens == 5
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    again = run_all(tiny, ChatRequest(messages=[{"role": "user", "content": "hi"}],
                                      sampling=Sampling(temperature=0), max_tokens=5))
    assert [e for e in again if isinstance(e, TextDelta)] == [e for e in events if isinstance(e, TextDelta)]
    # A top_k beyond the vocabulary keeps every token: the same greedy answer, not a crash.
    wide = run_all(tiny, ChatRequest(messages=[{"role": "user", "content": "hi"}],
                                     sampling=Sampling(temperature=0, top_k=10**7), max_tokens=5))
    assert [e for e in wide if isinstance(e, TextDelta)] == [e for e in events if isinstance(e, TextDelta)]
    # Any integer is a seed, negative and huge ones too.
    for seed in (-1, 2**70):
        assert isinstance(run_all(tiny, ChatRequest(messages=[{"role": "user", "content": "hi"}],
                                                    sampling=Sampling(seed=seed), max_tokens=2))[-1], Finished)
    for bad in (Sampling(temperature=-1), Sampling(top_p=1.5), Sampling(min_p=2), Sampling(presence_penalty=3)):
        with pytest.raises(EngineError, match="Generation options are outside their supported ranges."):
            run_all(tiny, ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling=bad))


# Asked without "Answer in one word." SmolLM2's first word is a near-tie ("The" 0.08 above "L" in
# float32), which bfloat16's rounding turns into a ramble in French; asked so, "The" leads by 1.4.
ONE_WORD_QUESTION = "What is the capital of France? Answer in one word."


def test_real_model_answers_and_stops(smollm2) -> None:
    req = ChatRequest(messages=[{"role": "user", "content": ONE_WORD_QUESTION}],
                      sampling=Sampling(temperature=0), max_tokens=30)
    events = run_all(smollm2, req)
    full = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert "Paris" in full and events[-1].finish_reason == "stop"
    req.stop = ["Paris"]
    text = "".join(e.text for e in run_all(smollm2, req) if isinstance(e, TextDelta))
    assert text == full[:full.index("Paris")] and text.startswith("The capital")  # cut just before the stop


def test_cancel_stops_generation(tiny) -> None:
    cancel = threading.Event()
    gen = generate(tiny, ChatRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=500), cancel)
    next(gen)
    cancel.set()
    from swama.engine.errors import Cancelled

    with pytest.raises(Cancelled):
        list(gen)


def test_tool_call_events_from_generation(smollm2) -> None:
    """The model is told about tools; whatever it emits, calls come out whole and parseable."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    events = run_all(smollm2, ChatRequest(messages=[{"role": "user", "content": "What's the weather in Paris?"}],
                                          sampling=Sampling(temperature=0), max_tokens=60, tools=tools))
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    for call in calls:
        assert isinstance(json.loads(call.arguments), dict)
    assert events[-1].finish_reason == ("tool_calls" if calls else events[-1].finish_reason)


def test_pool_shares_loads_runs_fifo_and_evicts(model_store: Path) -> None:
    loads: list[str] = []

    def counting_loader(model_id: str, path: Path):
        loads.append(model_id)
        time.sleep(0.3)  # widen the window in which concurrent requests must share one load
        return load_language_model(model_id, path)

    async def scenario() -> None:
        pool = ModelPool(ModelStore(model_store), EngineSettings(idle_seconds=0.5), loader=counting_loader)
        order: list[int] = []

        async def use(i: int) -> None:
            async with pool.use("test/tiny-qwen3"):
                order.append(i)
                await asyncio.sleep(0.01)

        tasks = [asyncio.ensure_future(use(i)) for i in range(6)]
        await asyncio.sleep(0)
        tasks[3].cancel()  # a waiter that leaves the queue
        await asyncio.gather(*tasks, return_exceptions=True)
        assert loads == ["test/tiny-qwen3"]
        assert order == [0, 1, 2, 4, 5]
        with pytest.raises(NotFound):
            async with pool.use("nope/missing"):
                pass
        assert pool.loaded() == ["test/tiny-qwen3"]
        assert pool.evict_idle(time.monotonic() + 1) == ["test/tiny-qwen3"]
        assert pool.loaded() == []
        await pool.close()

    asyncio.run(scenario())
