"""Refusals and the prompt/logit checks that run before and during decision scoring."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from swama.engine.errors import DecisionError

CHAT_TEMPLATE_REQUIRED = "Decision scoring requires a chat template."
CONTEXT_EXCEEDED = "The decision prompt exceeds the configured context limit."
SYSTEMONE_CONTEXT_PREFIX = "maximum context length: "
ROUND_TRIP_FAILED = "The rendered chat prompt does not round-trip through this tokenizer."
REASONING_OPEN = "The chat template leaves a reasoning block open at the answer position."
REASONING_OPENER_PREDICTED = "The model predicts a reasoning opener instead of a direct answer."
INVALID_NEXT_TOKEN_LOGITS = "The model returned invalid next-token logits."
INVALID_DECISION_LOGITS = "The model returned invalid decision logits."

REASONING_OPENERS = ("<think>", "[THINK]")
_THINK_PAIRS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))
_CHANNEL_MARKERS = ("<|channel|>", "<|channel>")
_OPEN_CHANNELS = ("analysis", "thought")


class _TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def check_context(token_count: int, limit: int, systemone: bool = False) -> None:
    """A prompt needs at least one token and strictly fewer than ``limit``; it is never trimmed."""
    if 1 <= token_count < limit:
        return
    prefix = SYSTEMONE_CONTEXT_PREFIX if systemone else ""
    raise DecisionError(400, prefix + CONTEXT_EXCEEDED)


def check_round_trip(tokenizer: _TextCodec, ids: Sequence[int]) -> None:
    if tokenizer.encode(tokenizer.decode(ids)) != list(ids):
        raise DecisionError(400, ROUND_TRIP_FAILED)


def reasoning_is_open(text: str) -> bool:
    """Whether ``text`` ends inside a ``<think>``/``[THINK]`` block or an analysis/thought channel."""
    for opener, closer in _THINK_PAIRS:
        start = text.rfind(opener)
        if start >= 0 and text.find(closer, start + len(opener)) < 0:
            return True
    channel_end = -1
    for marker in _CHANNEL_MARKERS:
        at = text.rfind(marker)
        if at >= 0:
            channel_end = max(channel_end, at + len(marker))
    return channel_end >= 0 and text[channel_end:].strip().startswith(_OPEN_CHANNELS)


def answer_position_text(prompt_text: str, content: str) -> str:
    """The prompt after the last occurrence of the content's last line (quoted input is skipped)."""
    last_line = content.rsplit("\n", 1)[-1]
    at = prompt_text.rfind(last_line) if last_line else -1
    return prompt_text[at + len(last_line) :] if at >= 0 else prompt_text


def check_reasoning_closed(prompt_text: str, content: str) -> None:
    if reasoning_is_open(answer_position_text(prompt_text, content)):
        raise DecisionError(400, REASONING_OPEN)


def reasoning_opener_ids(tokenizer: _TextCodec) -> list[int]:
    """Ids of the reasoning openers that encode to one token decoding back to the marker."""
    ids: list[int] = []
    for marker in REASONING_OPENERS:
        encoded = tokenizer.encode(marker)
        if len(encoded) == 1 and tokenizer.decode(encoded) == marker and encoded[0] not in ids:
            ids.append(encoded[0])
    return ids


def check_no_reasoning_opener(logits: Sequence[float] | np.ndarray, opener_ids: Sequence[int]) -> None:
    """Refuse when a reasoning opener's logit equals the vocabulary maximum (ties count)."""
    z = np.asarray(logits, dtype=np.float32)
    if z.ndim != 1 or z.size == 0:
        return  # malformed logits are reported by the scoring math as a server error
    top = z.max()
    for token_id in opener_ids:
        if 0 <= token_id < z.size and z[token_id] == top:
            raise DecisionError(400, REASONING_OPENER_PREDICTED)
