"""Adapter from a Hugging Face ``tokenizers`` tokenizer (or a fast ``transformers`` one) to
``LabelTokenizer``. Nothing is imported from either library; the object is used as given."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .labels import AddedToken


def _byte_level_without_prefix_space(step: Mapping[str, Any]) -> bool:
    return step.get("type") == "ByteLevel" and step.get("add_prefix_space") is False


def splits_at_added_tokens(config: Mapping[str, Any]) -> bool:
    """Whether tokenizer.json's pipeline tokenises the text between added tokens independently:
    no normaliser or NFC only, and a byte-level pre-tokeniser that adds no prefix space, optionally
    preceded by splitting steps."""
    normalizer = config.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return False
    pre = config.get("pre_tokenizer")
    if not isinstance(pre, Mapping):
        return False
    if pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
        return (
            bool(steps)
            and _byte_level_without_prefix_space(steps[-1])
            and all(step.get("type") in ("Split", "Digits") for step in steps[:-1])
        )
    return _byte_level_without_prefix_space(pre)


class HFLabelTokenizer:
    """``LabelTokenizer`` over ``tokenizers.Tokenizer`` or anything with a ``backend_tokenizer``."""

    def __init__(self, tokenizer: Any) -> None:
        self._backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self.added_tokens: Mapping[int, AddedToken] = {
            token_id: AddedToken(token.content, bool(token.lstrip), bool(token.rstrip))
            for token_id, token in self._backend.get_added_tokens_decoder().items()
        }
        self.splits_at_added_tokens: bool = splits_at_added_tokens(json.loads(self._backend.to_str()))

    def encode(self, text: str) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text, run in parallel by the tokenizer."""
        return [list(e.ids) for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return self._backend.decode_batch([list(ids) for ids in batch], skip_special_tokens=False)
