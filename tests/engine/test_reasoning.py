"""Thinking apart from the answer: the splitter, the template's switch, the thinking budget, the
scheduler path and decisions, on a tiny random qwen3 with Qwen3's own tokenizer and chat template."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from swama.engine.decisions.decide import DecisionJob
from swama.engine.decisions.decide import prepare as prepare_decisions
from swama.engine.decisions.scorer.questions import decision_choice_view, predicate_view
from swama.engine.errors import BadInput
from swama.engine.model import LoadedModel
from swama.engine.serving.scheduler import Scheduler
from swama.engine.text.generator import (
    ChatRequest,
    Decoder,
    Finished,
    ReasoningDelta,
    Sampling,
    TextDelta,
    ToolCallEvent,
    generate,
    prepare,
)
from swama.engine.text.grammar import Constraint, ToolSpec
from swama.engine.text.language import load_language_model
from swama.engine.text.reasoning import ReasoningSplitter, ThinkMarkers, markers

MARKERS = ThinkMarkers("<think>", "</think>", ())
GREEDY = Sampling(temperature=0.0)


def split(pieces: list[str], opened: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(MARKERS, opened)
    thought, answer = "", ""
    for piece in pieces:
        t, a = splitter.feed(piece)
        thought, answer = thought + t, answer + a
    t, a = splitter.finish()
    return thought + t, answer + a


def chunks(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 100])
def test_splitter_separates_thinking_in_any_chunking(size: int) -> None:
    text = "<think>\nFirst, 2 < 3.\nSo yes.\n</think>\n\nThe answer is yes."
    assert split(chunks(text, size)) == ("First, 2 < 3.\nSo yes.", "The answer is yes.")
    # A prompt that opened the block: the output starts inside it.
    assert split(chunks("weigh it\n</think>\n\nDone", size), opened=True) == ("weigh it", "Done")
    # No block: all answer, including a '<' that only looked like a marker's start.
    assert split(chunks("<this> is not thinking", size)) == ("", "<this> is not thinking")
    assert split(chunks("  plain answer", size)) == ("", "  plain answer")
    # Thinking cut off by max_tokens stays thinking.
    assert split(chunks("<think>\nstill going", size)) == ("still going", "")


def test_splitter_keeps_markers_inside_the_answer() -> None:
    # Only a block before any answer text is thinking.
    assert split(["Sure. <think>x</think> y"]) == ("", "Sure. <think>x</think> y")


@pytest.fixture(scope="module")
def thinker(tiny_thinking_dir: Path) -> LoadedModel:
    return load_language_model("tiny-thinking", tiny_thinking_dir)


def ask(**fields: object) -> ChatRequest:
    messages = [{"role": "user", "content": "Is 2 less than 3?"}]
    return ChatRequest(messages=messages, sampling=GREEDY, max_tokens=24, context_limit=2048, **fields)


def prefilled(**fields: object) -> ChatRequest:
    """The answer starts with an opened think block (a prefill, as Anthropic's API takes one)."""
    messages = [{"role": "user", "content": "Is 2 less than 3?"}, {"role": "assistant", "content": "<think>\n"}]
    return ChatRequest(messages=messages, sampling=GREEDY, max_tokens=24, context_limit=2048, continue_final=True,
                       **fields)


def test_qwen3_template_thinks_and_the_switch_reaches_it(thinker: LoadedModel) -> None:
    found = markers(thinker)
    assert found is not None and (found.start, found.end) == ("<think>", "</think>")
    assert found.end_ids == (thinker.tokenizer.convert_tokens_to_ids("</think>"),)
    on, off, default = prepare(thinker, ask(thinking=True)), prepare(thinker, ask(thinking=False)), prepare(thinker, ask())
    assert on.text.endswith("<|im_start|>assistant\n") and not on.opens_thinking
    assert off.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and not off.opens_thinking
    assert default.text == on.text  # Qwen3 thinks unless told not to
    assert prepare(thinker, prefilled()).opens_thinking


def test_decoder_splits_qwen3_tokens(thinker: LoadedModel) -> None:
    tok = thinker.tokenizer
    ids = tok.encode("<think>\nLet me see.\n</think>\n\nYes, it is.", add_special_tokens=False)
    decoder = Decoder(thinker, ask(), prompt_tokens=10)
    events = [e for t in ids for e in decoder.token(t)] + decoder.finish("stop")
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Let me see."
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Yes, it is."
    done = events[-1]
    assert isinstance(done, Finished) and 0 < done.reasoning_tokens < done.completion_tokens == len(ids)


def run(model: LoadedModel, request: ChatRequest) -> tuple[str, str, Finished]:
    events = list(generate(model, request, threading.Event()))
    done = events[-1]
    assert isinstance(done, Finished)
    return ("".join(e.text for e in events if isinstance(e, ReasoningDelta)),
            "".join(e.text for e in events if isinstance(e, TextDelta)), done)


@pytest.mark.parametrize("budget", [1, 5, 12])
def test_budget_closes_the_block(thinker: LoadedModel, budget: int) -> None:
    close = thinker.tokenizer.convert_tokens_to_ids("</think>")
    thought, answer, done = run(thinker, prefilled(thinking_budget=budget))
    # The random model never closes a block itself: the budget does, right after `budget` tokens.
    assert list(done.token_ids).index(close) == budget
    assert thought and answer and "</think>" not in thought + answer
    assert done.reasoning_tokens >= budget + 1


def test_no_budget_and_no_switch_leave_the_output_alone(thinker: LoadedModel) -> None:
    _, _, free = run(thinker, prefilled())
    _, _, off = run(thinker, prefilled(thinking=False, thinking_budget=3))  # off: no budget applies
    close = thinker.tokenizer.convert_tokens_to_ids("</think>")
    assert close not in free.token_ids[:20]
    thought, answer, plain = run(thinker, ask(thinking=False))
    assert thought == "" and answer and plain.reasoning_tokens == 0
    assert off.completion_tokens == 24


def test_scheduler_rows_split_and_budget_like_alone(thinker: LoadedModel) -> None:
    async def main() -> list[tuple[str, str, Finished]]:
        scheduler = Scheduler(thinker, prompt_cache=None, rows=4, prefill_step=16)
        try:
            async def one(request: ChatRequest) -> tuple[str, str, Finished]:
                thought, answer, done = "", "", None
                async for event in scheduler.generate(request):
                    if isinstance(event, ReasoningDelta):
                        thought += event.text
                    elif isinstance(event, TextDelta):
                        answer += event.text
                    elif isinstance(event, Finished):
                        done = event
                assert done is not None
                return thought, answer, done
            return await asyncio.gather(one(prefilled(thinking_budget=4)), one(ask(thinking=False)),
                                        one(prefilled()))
        finally:
            scheduler.close()

    batched = asyncio.run(main())
    expected = [run(thinker, prefilled(thinking_budget=4)), run(thinker, ask(thinking=False)), run(thinker, prefilled())]
    for (t, a, d), (et, ea, ed) in zip(batched, expected, strict=True):
        assert (t, a, d.token_ids, d.reasoning_tokens) == (et, ea, ed.token_ids, ed.reasoning_tokens)


def test_decisions_never_score_inside_a_think_block(thinker: LoadedModel) -> None:
    job = DecisionJob("2 < 3", [predicate_view("Is the statement true?"),
                                decision_choice_view("Which is smaller?", [("2", None), ("3", None)])], 2048)
    for question in prepare_decisions(thinker, job):
        text = thinker.tokenizer.decode(question.ids)
        # Qwen3's template with enable_thinking false closes an empty block: the label follows it.
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tool_calls_after_thinking_parse_as_before(thinker: LoadedModel) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "",
                                               "parameters": {"type": "object", "properties": {}}}}]
    text = ('<think>\nI should call <tool_call> get_weather.\n</think>\n\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    ids = thinker.tokenizer.encode(text, add_special_tokens=False)
    decoder = Decoder(thinker, ChatRequest(messages=[], tools=tools), prompt_tokens=10)
    events = [e for t in ids for e in decoder.token(t)] + decoder.finish("stop")
    # A marker written inside the thinking is thinking, not a call.
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "I should call <tool_call> get_weather."
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]
    assert not [e for e in events if isinstance(e, TextDelta)] and events[-1].finish_reason == "tool_calls"


def test_a_grammar_from_the_first_token_leaves_no_room_for_thinking(thinker: LoadedModel) -> None:
    json_answer = Constraint("json_object")
    # Not asked: the template renders thinking off, so the answer (held to JSON) starts at once.
    assert prepare(thinker, ask(constraint=json_answer)).text.endswith("<think>\n\n</think>\n\n")
    with pytest.raises(BadInput, match="^Thinking and a structured answer"):
        prepare(thinker, ask(constraint=json_answer, thinking=True))
    # Strict tool arguments constrain only the call: thinking may come first.
    strict = Constraint("tool_arguments", tools=(ToolSpec("f", '{"type": "object"}', True),))
    assert prepare(thinker, ask(constraint=strict)).text.endswith("<|im_start|>assistant\n")
