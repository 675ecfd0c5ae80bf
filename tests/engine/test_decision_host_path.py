"""The host side of a decision request: prompts encoded with their shared input once, label checks
kept per tokenizer, and logits projected only at the scored positions. Each shortcut must give what
the plain computation gives."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from precision import BF16_TINY_LOGIT_STEP, f32_reordered, tol
from test_decisions_batched import INPUT, mixed_questions
from tokenizers import Tokenizer, models, trainers

from swama.engine.decisions.decide import DecisionJob, _render, prepare
from swama.engine.decisions.heads import _verified, fill_cache, head_split, logits_at
from swama.engine.decisions.scorer import (
    HFLabelTokenizer,
    build_content,
    label_token_ids,
    labels_for,
    predicate_view,
)
from swama.engine.decisions.scorer.batch_encode import (
    MIN_SHARED_CHARS,
    encode_prompts,
    round_trips,
    shared_cut,
)
from swama.engine.model import LoadedModel
from swama.engine.text.language import load_language_model
from tools.testmodels.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_language_model("tiny", build_tiny_model(smollm2_dir, tmp_path_factory.mktemp("tiny") / "qwen3"))


def prompts_of(model: LoadedModel) -> list[str]:
    return [_render(model, build_content(INPUT, view, labels_for(view, lambda: None)))
            for view in mixed_questions()]


class Counting:
    """The real tokenizer, counting how many characters it is asked to encode."""

    def __init__(self, inner: HFLabelTokenizer) -> None:
        self.inner, self.chars = inner, 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def encode(self, text: str) -> list[int]:
        self.chars += len(text)
        return self.inner.encode(text)

    def encode_batch(self, texts):
        self.chars += sum(map(len, texts))
        return self.inner.encode_batch(texts)


def test_shared_input_is_encoded_once_with_the_same_ids(tiny: LoadedModel) -> None:
    prompts = prompts_of(tiny)
    tok = Counting(HFLabelTokenizer(tiny.tokenizer._tokenizer))
    encoded = encode_prompts(tok, prompts)
    assert encoded.ids == [tok.inner.encode(p) for p in prompts]
    assert encoded.head > 100  # the chat header and most of the input, once
    # The input once, each tail, and the longest prompt whole as the check: far less than all of them
    # (measured 10.2k of 38.6k characters, 0.265; the input encoded once more would pass 0.3).
    assert tok.chars < 0.3 * sum(map(len, prompts))
    assert round_trips(tok, prompts, encoded) == [True] * len(prompts)


def test_a_tokenizer_that_merges_across_lines_gets_whole_prompts() -> None:
    """No pre-tokenizer: BPE merges run across the newline, so the cut is not a boundary; the check
    on the longest prompt sees that and every prompt is encoded whole."""
    lines = "\n".join(f"Message {i} arrived" for i in range(40))
    backend = Tokenizer(models.BPE())
    backend.train_from_iterator([lines] * 20, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    tok = HFLabelTokenizer(backend)
    prompts = [lines + f"\nMessage question {q}?" for q in range(4)]
    assert shared_cut(lines) > MIN_SHARED_CHARS
    encoded = encode_prompts(tok, prompts)
    assert encoded.ids == [tok.encode(p) for p in prompts]


def test_shared_cut_needs_a_line_start_past_the_minimum() -> None:
    assert shared_cut("x" * 1000) == 0
    assert shared_cut("a\n" + "b" * 1000) == 0  # too early
    text = "a" * 400 + "\nBody" + "c" * 100
    assert shared_cut(text) == 401 and text[401] == "B"
    assert shared_cut("a" * 400 + "\n " + "c" * 100) == 0  # a space after the newline could join it


def test_label_checks_are_kept_per_tokenizer(tiny: LoadedModel) -> None:
    view = predicate_view("Is this about billing?")
    labels = labels_for(view, lambda: None)
    tok = Counting(HFLabelTokenizer(tiny.tokenizer._tokenizer))
    memo: dict = {}
    first_prompt = _render(tiny, build_content(INPUT, view, labels))
    ids = tok.inner.encode(first_prompt)
    expected = label_token_ids(tok.inner, first_prompt, ids, labels)
    assert label_token_ids(tok, first_prompt, ids, labels, memo) == expected
    other = _render(tiny, build_content(INPUT + "\nOne more line.", view, labels))
    tok.chars = 0
    assert label_token_ids(tok, other, tok.inner.encode(other), labels, memo) == expected
    assert tok.chars < 100  # the prompt's tail only, not the whole prompt again


def test_prepare_gives_each_question_its_own_full_encoding(tiny: LoadedModel) -> None:
    job = DecisionJob(INPUT, mixed_questions(), context_limit=4096)
    tok = HFLabelTokenizer(tiny.tokenizer._tokenizer)
    for q in prepare(tiny, job):
        content = build_content(INPUT, q.view, labels_for(q.view, lambda: None))
        assert q.ids == tok.encode(_render(tiny, content))


def test_the_head_runs_only_at_the_scored_positions(tiny: LoadedModel) -> None:
    net = tiny.model
    split = head_split(net)
    assert split is not None
    tokens = mx.array([list(range(1, 41)), list(range(41, 81))])
    rows, cols = mx.array([0, 1]), mx.array([39, 17])
    whole = logits_at(net, None, tokens, make_prompt_cache(net), rows, cols)
    parts = logits_at(net, split, tokens, make_prompt_cache(net), rows, cols)
    # The head over two rows alone rounds apart from the whole forward's. float32: the body is the same
    # computation, the final norm and head sum over H = 64 in another row count, logits under 16 (the
    # magnitude is in the bound: no rtol); bf16: by up to a step of the tiny model's logits (0.0625
    # under 16). The argmax may then differ only where the top two are within two such bounds.
    head = f32_reordered(16, 2 * 64)
    assert np.allclose(np.array(whole), np.array(parts), atol=tol(head, BF16_TINY_LOGIT_STEP), rtol=tol(0.0, 1e-3))
    low, high = mx.sort(whole[0])[-2:].tolist()
    assert int(mx.argmax(whole[0])) == int(mx.argmax(parts[0])) or high - low < tol(2 * head, 2 * BF16_TINY_LOGIT_STEP)


def test_a_forward_that_changes_the_logits_after_the_head_keeps_the_whole_forward(tiny: LoadedModel) -> None:
    body, head = head_split(tiny.model)
    assert not _verified(tiny.model, (body, lambda h: head(h) * 2.0))


def test_filling_the_prefix_gives_the_cache_the_whole_forward_gives(tiny: LoadedModel) -> None:
    net = tiny.model
    tokens = mx.array([list(range(1, 301))])
    filled, whole = make_prompt_cache(net), make_prompt_cache(net)
    fill_cache(net, tokens, filled)
    mx.eval(net(tokens, cache=whole))
    for a, b in zip(filled, whole, strict=True):
        assert a.offset == b.offset == 300
        assert mx.array_equal(a.state[0], b.state[0]).item() and mx.array_equal(a.state[1], b.state[1]).item()
