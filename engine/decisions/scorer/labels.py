"""Answer labels and the checks that make each one a single, distinct token at the answer position.

Everything here talks to a tokenizer through ``LabelTokenizer`` so it runs on any tokenizer that can
encode without adding special tokens, decode keeping them, and list its added tokens.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .checks import DecisionError, check_reasoning_closed, check_round_trip
from .questions import MAX_LETTER_OPTIONS, QuestionView

YES_NO_LABELS: tuple[str, ...] = ("yes", "no")
LETTER_LABELS: tuple[str, ...] = tuple(string.ascii_uppercase)
DIGIT_LABELS: tuple[str, ...] = tuple(string.digits)
PAIR_CANDIDATES: tuple[str, ...] = tuple(
    a + b for a in string.ascii_uppercase for b in string.ascii_uppercase
)

PAIR_PROBE_CONTENTS = ("x", "y")
PAIR_LABELS_UNAVAILABLE = (
    "More than 26 options per choice needs an added token before the answer position, "
    "which this tokenizer and chat template do not provide."
)


def label_not_single_token(label: str) -> str:
    return f"The answer label '{label}' is not one distinct token after the chat prompt."


def too_many_options(supported: int, requested: int) -> str:
    return f"This model supports at most {supported} options per choice; the question has {requested}."


@dataclass(frozen=True)
class AddedToken:
    content: str
    lstrip: bool = False
    rstrip: bool = False


class LabelTokenizer(Protocol):
    """The tokenizer operations the label checks need.

    ``encode`` must not add special tokens; ``decode`` must keep them. ``added_tokens`` maps the
    id of every added (special or not) token to its text and strip flags. ``splits_at_added_tokens``
    says the text between added tokens is normalised and pre-tokenised on its own, so a prompt
    may be checked from its last added token onwards.
    """

    @property
    def added_tokens(self) -> Mapping[int, AddedToken]: ...

    @property
    def splits_at_added_tokens(self) -> bool: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class Boundary:
    """The prompt tail after its last added token, tokenised on its own."""

    marker_position: int
    suffix: str
    suffix_ids: tuple[int, ...]


def added_token_boundary(
    tokenizer: LabelTokenizer, prompt_text: str, prompt_ids: Sequence[int], first_label: str,
    memo: dict | None = None,
) -> Boundary | None:
    """The added-token shortcut, or ``None`` when the whole prompt must be re-encoded per label.

    ``memo`` (one dict per tokenizer) keeps the whole-prompt check's verdict per marker, tail and
    first label: with a tokenizer that splits at added tokens, the text before the marker cannot
    change it, and re-encoding the whole prompt is the costly part."""
    added = tokenizer.added_tokens
    if not tokenizer.splits_at_added_tokens or any(t.lstrip or t.rstrip for t in added.values()):
        return None
    position = next((i for i in range(len(prompt_ids) - 1, -1, -1) if prompt_ids[i] in added), None)
    if position is None:
        return None
    marker = added[prompt_ids[position]].content
    if not marker or any(marker != t.content and marker in t.content for t in added.values()):
        return None
    at = prompt_text.rfind(marker)
    if at < 0:
        return None
    suffix = prompt_text[at + len(marker) :]
    suffix_ids = list(prompt_ids[position + 1 :])
    if tokenizer.encode(suffix) != suffix_ids:
        return None
    key = ("boundary", marker, suffix, first_label)
    if memo is None or key not in memo:
        head = list(prompt_ids[: position + 1])
        verdict = tokenizer.encode(prompt_text + first_label) == head + tokenizer.encode(suffix + first_label)
        if memo is None:
            return Boundary(position, suffix, tuple(suffix_ids)) if verdict else None
        _remember(memo, key, verdict)
    return Boundary(position, suffix, tuple(suffix_ids)) if memo[key] else None


MEMO_ENTRIES = 4096  # label checks kept per tokenizer; the memo starts afresh past this


def _remember(memo: dict, key: tuple, value: object) -> None:
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    memo[key] = value


def _single_new_token(encoded: Sequence[int], base_ids: Sequence[int]) -> int | None:
    if len(encoded) != len(base_ids) + 1 or list(encoded[:-1]) != list(base_ids):
        return None
    return encoded[-1]


def label_token_ids(
    tokenizer: LabelTokenizer, prompt_text: str, prompt_ids: Sequence[int], labels: Sequence[str],
    memo: dict | None = None,
) -> list[int]:
    """Check that each label adds exactly one new, distinct token to the prompt; return the ids.

    With ``memo`` and an added-token boundary, a label set checked once after the same prompt tail
    is not checked again (the tail is all the check reads)."""
    if not labels:
        return []
    boundary = added_token_boundary(tokenizer, prompt_text, prompt_ids, labels[0], memo)
    key = ("labels", boundary.suffix, tuple(labels)) if boundary is not None and memo is not None else None
    if key is not None and key in memo:
        return list(memo[key])
    base_text, base_ids = (
        (boundary.suffix, boundary.suffix_ids) if boundary else (prompt_text, tuple(prompt_ids))
    )
    ids: list[int] = []
    for label in labels:
        token = _single_new_token(tokenizer.encode(base_text + label), base_ids)
        if token is None or token in ids:
            raise DecisionError(400, label_not_single_token(label))
        ids.append(token)
    if key is not None:
        _remember(memo, key, tuple(ids))
    return ids


def find_pair_labels(
    tokenizer: LabelTokenizer, render_prompt: Callable[[str], str]
) -> tuple[str, ...] | None:
    """The usable two-letter labels in ``AA``…``ZZ`` order, or ``None`` when the chat prompt has no
    usable added-token boundary. ``render_prompt`` turns user content into the chat prompt text.

    The result depends only on the tokenizer and template, so callers cache it per loaded model.
    """
    boundaries: list[Boundary] = []
    for content in PAIR_PROBE_CONTENTS:
        try:
            prompt_text = render_prompt(content)
            prompt_ids = tokenizer.encode(prompt_text)
            check_round_trip(tokenizer, prompt_ids)
            check_reasoning_closed(prompt_text, content)
        except DecisionError:
            return None
        boundary = added_token_boundary(tokenizer, prompt_text, prompt_ids, PAIR_CANDIDATES[0])
        if boundary is None:
            return None
        boundaries.append(boundary)
    if any(b.suffix != boundaries[0].suffix for b in boundaries):
        return None
    suffix, suffix_ids = boundaries[0].suffix, boundaries[0].suffix_ids
    kept: list[str] = []
    taken: set[int] = set()
    for pair in PAIR_CANDIDATES:
        token = _single_new_token(tokenizer.encode(suffix + pair), suffix_ids)
        if token is not None and token not in taken:
            kept.append(pair)
            taken.add(token)
    return tuple(kept)


PairLabelSource = Callable[[], Sequence[str] | None]


def choice_labels(option_count: int, pair_labels: PairLabelSource | None = None) -> list[str]:
    """``A``… up to 26 options; beyond that every option gets a pair label from ``pair_labels``."""
    if option_count <= MAX_LETTER_OPTIONS:
        return list(LETTER_LABELS[:option_count])
    pairs = pair_labels() if pair_labels is not None else None
    if pairs is None:
        raise DecisionError(400, PAIR_LABELS_UNAVAILABLE)
    if len(pairs) < option_count:
        # Up to 26 options always fit the single letters, whatever the pair capacity.
        raise DecisionError(400, too_many_options(max(MAX_LETTER_OPTIONS, len(pairs)), option_count))
    return list(pairs[:option_count])


def labels_for(view: QuestionView, pair_labels: PairLabelSource | None = None) -> list[str]:
    if view.kind == "yes_no":
        return list(YES_NO_LABELS)
    if view.kind == "score":
        if view.option_count > len(DIGIT_LABELS):
            raise ValueError(f"a score has at most {len(DIGIT_LABELS)} levels")
        return list(DIGIT_LABELS[: view.option_count])
    return choice_labels(view.option_count, pair_labels)
