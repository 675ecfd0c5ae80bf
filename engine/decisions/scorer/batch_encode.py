"""Token ids for the prompts of one decision request, which share most of their text.

Every question of a request renders to a prompt that starts with the same chat header and input
and differs only near its end. Encoding each prompt whole re-tokenizes the shared input once per
question (and the round-trip check once more), the largest host cost of a request. Instead the
common text is cut at a line start and encoded once; each prompt's tail after the cut is encoded on
its own, and the ids are joined.

The join is exact when the tokenizer treats the cut as a boundary: a newline followed by a letter or
digit ends every pre-token of the byte-level BPE tokenizers (GPT-2, Llama 3, Qwen), and the text
around the cut is the same in every prompt, so the prompts agree on it or all disagree. One prompt
per request (the longest) is therefore also encoded whole, and any difference falls back to
encoding every prompt whole. Tokenizers for which the join is not exact (SentencePiece pieces that
span lines) keep that fallback.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

MIN_SHARED_CHARS = 256  # below this, the whole prompts are encoded
CUT_MARGIN = 64  # characters of common text the cut keeps after it, so the text around it is shared


class BatchCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]: ...


def shared_cut(common: str) -> int:
    """Where to cut the common text: just after a newline that a letter or digit follows, at least
    `CUT_MARGIN` characters before its end; 0 when there is no such place past `MIN_SHARED_CHARS`."""
    at = len(common) - CUT_MARGIN
    while at > MIN_SHARED_CHARS:
        at = common.rfind("\n", 0, at)
        if at < MIN_SHARED_CHARS:
            return 0
        if common[at + 1].isalnum():
            return at + 1
    return 0


@dataclass(frozen=True)
class Encoded:
    ids: list[list[int]]  # tok.encode(prompt) of every prompt
    head: int  # leading ids every prompt shares, encoded once (0: every prompt encoded whole)


def encode_prompts(tok: BatchCodec, prompts: Sequence[str]) -> Encoded:
    """`tok.encode(p)` for every prompt, encoding their common text once where that is exact."""
    if len(prompts) < 2:
        return Encoded([tok.encode(p) for p in prompts], 0)
    cut = shared_cut(os.path.commonprefix(list(prompts)))
    if cut == 0:
        return Encoded(tok.encode_batch(prompts), 0)
    longest = _longest(prompts)
    # One call, so the tokenizer's threads encode the head, the check and the tails side by side.
    head, whole, *tails = tok.encode_batch([prompts[0][:cut], prompts[longest], *(p[cut:] for p in prompts)])
    ids = [head + tail for tail in tails]
    if whole != ids[longest]:
        return Encoded(tok.encode_batch(prompts), 0)
    return Encoded(ids, len(head))


def _longest(prompts: Sequence[str]) -> int:
    return max(range(len(prompts)), key=lambda i: len(prompts[i]))


def _decoded(tok: BatchCodec, prompts: Sequence[str], encoded: Encoded) -> list[str]:
    """Each prompt's ids decoded; with a shared head, the head once and each tail on its own, where
    that gives the longest prompt's whole decode (the same argument as for encoding)."""
    if encoded.head:
        k = _longest(prompts)
        head, whole, *tails = tok.decode_batch([encoded.ids[0][: encoded.head], encoded.ids[k],
                                                *(row[encoded.head:] for row in encoded.ids)])
        texts = [head + tail for tail in tails]
        if whole == texts[k]:
            return texts
    return tok.decode_batch(encoded.ids)


def round_trips(tok: BatchCodec, prompts: Sequence[str], encoded: Encoded) -> list[bool]:
    """For each prompt and its ids (`tok.encode(prompt)`), whether encoding the decoded ids gives the
    ids back. Where the ids decode to the prompt itself that holds by construction; only the others
    are encoded again."""
    return [text == prompt or tok.encode(text) == row
            for text, prompt, row in zip(_decoded(tok, prompts, encoded), prompts, encoded.ids, strict=True)]
