"""Answer labels, the single-token check, the added-token shortcut, pair labels and prompt checks."""

from __future__ import annotations

import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from swama.engine.decisions.scorer import (
    DIGIT_LABELS,
    LETTER_LABELS,
    PAIR_CANDIDATES,
    YES_NO_LABELS,
    AddedToken,
    DecisionError,
    HFLabelTokenizer,
    added_token_boundary,
    answer_position_text,
    build_content,
    check_context,
    check_reasoning_closed,
    check_round_trip,
    choice_labels,
    find_pair_labels,
    label_token_ids,
    labels_for,
    noul_view,
    reasoning_is_open,
    reasoning_opener_ids,
    systemone_choice_view,
    systemone_score_view,
)
from swama.engine.decisions.scorer.hf_tokenizer import splits_at_added_tokens

PAIRS_UNAVAILABLE = (
    "More than 26 options per choice needs an added token before the answer position, "
    "which this tokenizer and chat template do not provide."
)

# A small tokenizer written for these tests --------------------------------------------------------


class FakeTokenizer:
    """Greedy longest-match tokenizer. Added tokens are split out first; each text segment is matched
    against ``pieces`` and falls back to one token per character. ``aliases`` map a piece onto the
    id of another piece, to model two texts sharing a token."""

    CHAR_BASE = 100_000

    def __init__(
        self,
        pieces: Iterable[str] = (),
        added: Sequence[str] = ("<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        *,
        aliases: Mapping[str, str] | None = None,
        splits: bool = True,
        rstrip: Sequence[str] = (),
    ) -> None:
        self.added_tokens = {i: AddedToken(text, rstrip=text in rstrip) for i, text in enumerate(added)}
        self._added_ids = {token.content: i for i, token in self.added_tokens.items()}
        self._piece_ids = {piece: 1000 + i for i, piece in enumerate(dict.fromkeys(pieces))}
        for piece, target in (aliases or {}).items():
            self._piece_ids[piece] = self._piece_ids[target]
        self._texts = {i: t for t, i in self._piece_ids.items() if t not in (aliases or {})}
        self._lengths = sorted({len(p) for p in self._piece_ids}, reverse=True)
        self.splits_at_added_tokens = splits
        self.calls: list[str] = []

    def _segment(self, text: str) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for length in self._lengths:
                piece = text[i : i + length]
                if len(piece) == length and piece in self._piece_ids:
                    ids.append(self._piece_ids[piece])
                    i += length
                    break
            else:
                ids.append(self.CHAR_BASE + ord(text[i]))
                i += 1
        return ids

    def encode(self, text: str) -> list[int]:
        self.calls.append(text)
        ids: list[int] = []
        start = i = 0
        markers = sorted(self._added_ids, key=len, reverse=True)
        while i < len(text):
            marker = next((m for m in markers if text.startswith(m, i)), None)
            if marker is None:
                i += 1
                continue
            ids += self._segment(text[start:i]) + [self._added_ids[marker]]
            i = start = i + len(marker)
        return ids + self._segment(text[start:])

    def decode(self, ids: Sequence[int]) -> str:
        parts = []
        for token in ids:
            if token in self.added_tokens:
                parts.append(self.added_tokens[token].content)
            elif token >= self.CHAR_BASE:
                parts.append(chr(token - self.CHAR_BASE))
            else:
                parts.append(self._texts[token])
        return "".join(parts)

    def id_of(self, piece: str) -> int:
        return self._piece_ids[piece]


BASE_PIECES = [
    "user",
    "assistant",
    "Answer",
    "\n\n",
    " A",
    " yes",
    *LETTER_LABELS,
    *DIGIT_LABELS,
    "yes",
    "no",
]


def chatml(content: str, tail: str = "") -> str:
    return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n{tail}"


def qwen_thinking_off(content: str) -> str:
    return chatml(content, "<think>\n\n</think>\n\n")


def _ids(tokenizer: FakeTokenizer, prompt: str, labels: Sequence[str]) -> list[int]:
    return label_token_ids(tokenizer, prompt, tokenizer.encode(prompt), labels)


def _refusal(call: Callable[[], object]) -> DecisionError:
    with pytest.raises(DecisionError) as caught:
        call()
    return caught.value


# Label sets ---------------------------------------------------------------------------------------


def test_label_sets() -> None:
    assert YES_NO_LABELS == ("yes", "no")
    assert LETTER_LABELS == tuple(string.ascii_uppercase)
    assert DIGIT_LABELS == tuple("0123456789")
    assert len(PAIR_CANDIDATES) == 676
    assert (
        PAIR_CANDIDATES[:3] == ("AA", "AB", "AC")
        and PAIR_CANDIDATES[26] == "BA"
        and PAIR_CANDIDATES[-1] == "ZZ"
    )


def test_labels_for_each_kind() -> None:
    assert labels_for(noul_view("q")) == ["yes", "no"]
    assert labels_for(systemone_score_view("q", ["a", "b", "c"])) == ["0", "1", "2"]
    letters = systemone_choice_view("q", [(f"o{i}", None) for i in range(26)])
    assert labels_for(letters) == list(string.ascii_uppercase)
    many = systemone_choice_view("q", [(f"o{i}", None) for i in range(27)])
    assert labels_for(many, lambda: ["AA", "AB", *[f"B{c}" for c in string.ascii_uppercase]]) == [
        "AA",
        "AB",
        *[f"B{c}" for c in string.ascii_uppercase[:25]],
    ]


def test_pairs_are_only_looked_up_beyond_26_options() -> None:
    def unavailable() -> None:
        raise AssertionError("pair labels requested")

    assert choice_labels(26, unavailable) == list(string.ascii_uppercase)  # type: ignore[arg-type]


# Single-token check -------------------------------------------------------------------------------


def test_qwen_like_prompt_labels_are_the_bare_tokens() -> None:
    tokenizer = FakeTokenizer(BASE_PIECES)
    prompt = qwen_thinking_off("x")
    for labels in (list(YES_NO_LABELS), list(LETTER_LABELS), list(DIGIT_LABELS)):
        assert _ids(tokenizer, prompt, labels) == [tokenizer.id_of(label) for label in labels]


@pytest.mark.parametrize("tail", ["Answer: ", "Answer:  "])
def test_template_ending_in_a_space_fails_for_a(tail: str) -> None:
    tokenizer = FakeTokenizer(BASE_PIECES)
    prompt = chatml("x", "\n" + tail)
    error = _refusal(lambda: _ids(tokenizer, prompt, ["A", "B"]))
    assert (error.status, error.message, error.type) == (
        400,
        "The answer label 'A' is not one distinct token after the chat prompt.",
        "invalid_request_error",
    )


def test_multi_token_label_is_refused() -> None:
    tokenizer = FakeTokenizer([p for p in BASE_PIECES if p != "no"])
    error = _refusal(lambda: _ids(tokenizer, qwen_thinking_off("x"), ["yes", "no"]))
    assert error.message == "The answer label 'no' is not one distinct token after the chat prompt."


def test_labels_sharing_a_token_are_refused() -> None:
    tokenizer = FakeTokenizer(BASE_PIECES, aliases={"B": "A"})
    error = _refusal(lambda: _ids(tokenizer, qwen_thinking_off("x"), ["A", "B", "C"]))
    assert error.message == "The answer label 'B' is not one distinct token after the chat prompt."


# Added-token boundary shortcut -----------------------------------------------------------------


def _whole_prompt_encodes(tokenizer: FakeTokenizer, prompt: str) -> int:
    return sum(call.startswith(prompt) for call in tokenizer.calls)


def test_shortcut_checks_labels_against_the_suffix() -> None:
    tokenizer = FakeTokenizer(BASE_PIECES)
    prompt = qwen_thinking_off("some long input")
    ids = tokenizer.encode(prompt)
    boundary = added_token_boundary(tokenizer, prompt, ids, "A")
    assert boundary is not None
    assert (boundary.marker_position, boundary.suffix, boundary.suffix_ids) == (
        len(ids) - 2,
        "\n\n",
        (tokenizer.id_of("\n\n"),),
    )
    tokenizer.calls.clear()
    label_token_ids(tokenizer, prompt, ids, list(LETTER_LABELS))
    assert _whole_prompt_encodes(tokenizer, prompt) == 1  # only the first label's consistency check
    assert tokenizer.calls.count("\n\nZ") == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: FakeTokenizer(BASE_PIECES, splits=False),
        lambda: FakeTokenizer(BASE_PIECES, rstrip=("<|im_end|>",)),
        lambda: FakeTokenizer(
            BASE_PIECES, added=("<|im_start|>", "<|im_end|>", "<think>", "</think>", "</think>x")
        ),
    ],
    ids=["pipeline-not-splitting", "rstrip-added-token", "marker-inside-another"],
)
def test_shortcut_is_skipped_but_labels_still_checked(make: Callable[[], FakeTokenizer]) -> None:
    tokenizer = make()
    prompt = qwen_thinking_off("x")
    ids = tokenizer.encode(prompt)
    assert added_token_boundary(tokenizer, prompt, ids, "A") is None
    tokenizer.calls.clear()
    assert label_token_ids(tokenizer, prompt, ids, ["A", "B", "C"]) == [tokenizer.id_of(c) for c in "ABC"]
    assert _whole_prompt_encodes(tokenizer, prompt) == 3


def test_shortcut_needs_an_added_token_in_the_prompt() -> None:
    tokenizer = FakeTokenizer(BASE_PIECES)
    prompt = "User: x\nAssistant:\n"
    assert added_token_boundary(tokenizer, prompt, tokenizer.encode(prompt), "A") is None
    assert _ids(tokenizer, prompt, ["A", "B"]) == [tokenizer.id_of("A"), tokenizer.id_of("B")]


def test_shortcut_needs_the_suffix_to_encode_to_the_prompt_tail() -> None:
    tokenizer = FakeTokenizer(BASE_PIECES)
    prompt = qwen_thinking_off("x")
    template_ids = tokenizer.encode(prompt)[:-1] + [tokenizer.CHAR_BASE + 10] * 2  # "\n", "\n" split apart
    assert tokenizer.decode(template_ids) == prompt
    assert added_token_boundary(tokenizer, prompt, template_ids, "A") is None
    error = _refusal(lambda: label_token_ids(tokenizer, prompt, template_ids, ["A"]))
    assert error.message == "The answer label 'A' is not one distinct token after the chat prompt."


# Pair labels ------------------------------------------------------------------------------------


def _pair_tokenizer(pairs: Iterable[str], **kwargs: object) -> FakeTokenizer:
    return FakeTokenizer([*BASE_PIECES, *pairs], **kwargs)  # type: ignore[arg-type]


def test_pair_labels_skip_unusable_and_taken_candidates() -> None:
    pairs = [p for p in PAIR_CANDIDATES if p != "AC"]
    tokenizer = _pair_tokenizer(pairs, aliases={"AF": "AE"})
    found = find_pair_labels(tokenizer, qwen_thinking_off)
    assert found is not None
    assert found[:5] == ("AA", "AB", "AD", "AE", "AG")
    assert len(found) == 674


def test_thirty_options_use_pair_labels() -> None:
    tokenizer = _pair_tokenizer(PAIR_CANDIDATES[:30])
    pairs = find_pair_labels(tokenizer, qwen_thinking_off)
    assert pairs == PAIR_CANDIDATES[:30]
    view = systemone_choice_view("Pick one", [(f"option {i}", None) for i in range(30)])
    labels = labels_for(view, lambda: pairs)
    content = build_content("state", view, labels)
    assert "AA: option 0" in content and "\nA: option 0" not in content
    assert content.endswith("\nBD: option 29\nAnswer with the letter of one option only.")
    prompt = qwen_thinking_off(content)
    ids = _ids(tokenizer, prompt, labels)
    assert len(set(ids)) == 30 and ids == [tokenizer.id_of(p) for p in PAIR_CANDIDATES[:30]]


def test_pair_capacity_refusal() -> None:
    pairs = PAIR_CANDIDATES[:30]
    error = _refusal(lambda: choice_labels(31, lambda: pairs))
    assert (error.status, error.message) == (
        400,
        "This model supports at most 30 options per choice; the question has 31.",
    )
    few = _refusal(lambda: choice_labels(27, lambda: PAIR_CANDIDATES[:5]))
    assert few.message == "This model supports at most 26 options per choice; the question has 27."


def test_pair_labels_unavailable_without_added_tokens() -> None:
    tokenizer = _pair_tokenizer(PAIR_CANDIDATES)
    assert find_pair_labels(tokenizer, lambda c: f"User: {c}\nAssistant: ") is None
    error = _refusal(lambda: choice_labels(27, lambda: None))
    assert (error.status, error.message) == (400, PAIRS_UNAVAILABLE)
    assert _refusal(lambda: choice_labels(27)).message == PAIRS_UNAVAILABLE


@pytest.mark.parametrize(
    "render",
    [
        lambda c: chatml(c, "<think>\n"),  # reasoning left open
        lambda c: f"<|im_start|>user\n<|im_end|>{c}\nassistant\n",  # content after the last added token
        lambda c: (_ for _ in ()).throw(DecisionError(400, "Decision scoring requires a chat template.")),
    ],
    ids=["open-reasoning", "suffix-differs", "no-template"],
)
def test_pair_label_probes_that_fail(render: Callable[[str], str]) -> None:
    assert find_pair_labels(_pair_tokenizer(PAIR_CANDIDATES), render) is None


def test_pair_label_probe_needs_a_round_trip() -> None:
    class Lossy(FakeTokenizer):
        def decode(self, ids: Sequence[int]) -> str:
            return super().decode(ids).replace("assistant", "assistant ")

    tokenizer = Lossy([*BASE_PIECES, *PAIR_CANDIDATES])
    assert find_pair_labels(tokenizer, qwen_thinking_off) is None


# Prompt checks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["assistant\n<think>\n", "[THINK]reasoning", "assistant<|channel|>analysis", "x<|channel> thought\n"],
)
def test_open_reasoning(text: str) -> None:
    assert reasoning_is_open(text)


@pytest.mark.parametrize(
    "text",
    [
        "assistant\n<think>\n\n</think>\n\n",
        "assistant<|channel|>final",
        "assistant\n",
        "[THINK]r[/THINK]",
        "<|channel|>analysis<|message|>..<|channel|>final",
    ],
)
def test_not_open_reasoning(text: str) -> None:
    assert not reasoning_is_open(text)


def test_reasoning_check_ignores_quoted_input() -> None:
    content = "please <think> about it\n\nIs the following true? Q\nAnswer with yes or no only."
    prompt = chatml(content)
    assert answer_position_text(prompt, content) == "<|im_end|>\n<|im_start|>assistant\n"
    check_reasoning_closed(prompt, content)
    error = _refusal(lambda: check_reasoning_closed(chatml(content, "<think>\n"), content))
    assert (error.status, error.message) == (
        400,
        "The chat template leaves a reasoning block open at the answer position.",
    )


def test_round_trip_check() -> None:
    tokenizer = FakeTokenizer(BASE_PIECES)
    prompt = qwen_thinking_off("x")
    check_round_trip(tokenizer, tokenizer.encode(prompt))
    split_ids = tokenizer.encode(prompt)[:-1] + [tokenizer.CHAR_BASE + 10] * 2
    error = _refusal(lambda: check_round_trip(tokenizer, split_ids))
    assert (error.status, error.message) == (
        400,
        "The rendered chat prompt does not round-trip through this tokenizer.",
    )


def test_reasoning_opener_ids_need_one_token_that_decodes_back() -> None:
    tokenizer = FakeTokenizer(BASE_PIECES, added=("<|im_start|>", "<think>", "</think>"))
    assert reasoning_opener_ids(tokenizer) == [1]
    with_brackets = FakeTokenizer(BASE_PIECES, added=("<think>", "[THINK]"))
    assert reasoning_opener_ids(with_brackets) == [0, 1]
    assert reasoning_opener_ids(FakeTokenizer(BASE_PIECES, added=())) == []


def test_context_check() -> None:
    check_context(1, 16384)
    check_context(16383, 16384)
    for count in (0, 16384, 20000):
        error = _refusal(lambda count=count: check_context(count, 16384))
        assert (error.status, error.message) == (
            400,
            "The decision prompt exceeds the configured context limit.",
        )
    error = _refusal(lambda: check_context(4096, 4096, systemone=True))
    assert (
        error.message == "maximum context length: The decision prompt exceeds the configured context limit."
    )


def test_decision_error_fields() -> None:
    assert (DecisionError(404, "m").type, DecisionError(413, "m").type) == ("invalid_request_error",) * 2
    error = DecisionError(500, "boom")
    assert (error.status, error.message, error.type, str(error)) == (500, "boom", "server_error", "boom")


# A real Hugging Face tokenizer, trained here ------------------------------------------------------


def _trained_tokenizer(add_prefix_space: bool = False):  # type: ignore[no-untyped-def]
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(r"\p{L}+|\p{N}|\s+|[^\s\p{L}\p{N}]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["user assistant yes no AA AB AD AA AB AD hello world"] * 20, trainer)
    tok.add_tokens([tokenizers.AddedToken(t, normalized=False) for t in ("<think>", "</think>")])
    return tok


def test_hf_adapter_on_a_trained_byte_level_tokenizer() -> None:
    tok = _trained_tokenizer()
    adapter = HFLabelTokenizer(tok)
    assert adapter.splits_at_added_tokens
    assert {t.content for t in adapter.added_tokens.values()} == {
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
    }
    prompt = qwen_thinking_off("Is it? ü")
    ids = adapter.encode(prompt)
    check_round_trip(adapter, ids)
    assert added_token_boundary(adapter, prompt, ids, "A") is not None
    for labels in (["yes", "no"], list(LETTER_LABELS), list(DIGIT_LABELS)):
        assert label_token_ids(adapter, prompt, ids, labels) == [tok.token_to_id(label) for label in labels]
    pairs = find_pair_labels(adapter, qwen_thinking_off)
    assert pairs == ("AA", "AB", "AD")
    assert reasoning_opener_ids(adapter) == [tok.token_to_id("<think>")]


def test_hf_adapter_reads_the_pipeline() -> None:
    assert not HFLabelTokenizer(_trained_tokenizer(add_prefix_space=True)).splits_at_added_tokens
    byte_level = {"type": "ByteLevel", "add_prefix_space": False}
    assert splits_at_added_tokens({"normalizer": None, "pre_tokenizer": byte_level})
    assert splits_at_added_tokens(
        {
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits"}, byte_level]},
        }
    )
    assert not splits_at_added_tokens({"normalizer": {"type": "NFKC"}, "pre_tokenizer": byte_level})
    assert not splits_at_added_tokens({"normalizer": None, "pre_tokenizer": {"type": "Metaspace"}})
    assert not splits_at_added_tokens({"normalizer": None, "pre_tokenizer": None})


def test_smollm2_label_tokens(smollm2_dir: Path) -> None:
    import tokenizers

    adapter = HFLabelTokenizer(tokenizers.Tokenizer.from_file(str(smollm2_dir / "tokenizer.json")))
    prompt = chatml("Is the sky blue on a clear day? Answer yes or no.")
    ids = adapter.encode(prompt)
    check_round_trip(adapter, ids)
    assert label_token_ids(adapter, prompt, ids, ["yes", "no"]) == [10407, 4607]
    assert label_token_ids(adapter, prompt, ids, ["A", "B"]) == [49, 50]
    assert len(set(label_token_ids(adapter, prompt, ids, list(LETTER_LABELS) + list(DIGIT_LABELS)))) == 36
    pairs = find_pair_labels(adapter, chatml)
    assert pairs is not None and len(pairs) == 377
    assert pairs[:9] == ("AA", "AB", "AC", "AD", "AE", "AF", "AG", "AH", "AI") and "AJ" not in pairs
