"""Build a Hugging Face tokenizer (``tokenizer.json`` and its configs) from GGUF vocabulary metadata.

``md`` is the GGUF metadata as a plain dict with decoded values. Two vocabulary kinds, named by
``tokenizer.ggml.model``, are understood:

* ``gpt2``: byte-level BPE, with the merges stored in the file and a split regex named by
  ``tokenizer.ggml.pre`` (SmolLM, Llama 3, Qwen 2).
* ``llama``: SentencePiece BPE (Llama 2, Mistral, Gemma, Phi-3). The file stores no merges, only
  piece scores: SentencePiece repeatedly joins the adjacent pair whose concatenation is the
  highest-scoring piece, so the merges are derived from the vocabulary and ranked by score.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from swama.engine.errors import GGUFImportError

# llama.cpp token types (llama_token_type).
_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 2, 3, 4
_TOKEN_UNUSED, _TOKEN_BYTE = 5, 6

# Split regexes of the HF tokenizers that llama.cpp names by ``tokenizer.ggml.pre``.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _regex_byte_level(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


_PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
    "llama-bpe": lambda: _regex_byte_level(_LLAMA3_SPLIT),
    "llama3": lambda: _regex_byte_level(_LLAMA3_SPLIT),
    "qwen2": lambda: _regex_byte_level(_QWEN2_SPLIT),
}
# Pre types whose HF tokenizer matches the whole vocabulary before applying merges.
_IGNORE_MERGES = {"llama-bpe", "llama3"}

_SUPPORTED_MODELS = "gpt2 (byte-level BPE), llama (SentencePiece)"

# SentencePiece's whitespace symbol.
_SPACE = "\u2581"

# What llama.cpp assumes for a SentencePiece vocabulary when the file leaves a key out.
_SPM_DEFAULTS: dict[str, Any] = {
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.unknown_token_id": 0,
    "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.add_eos_token": False,
    "tokenizer.ggml.add_space_prefix": True,
}


@dataclass(frozen=True)
class SpecialTokens:
    bos: str | None
    eos: str | None
    unk: str | None
    pad: str | None


def _special_tokens(md: dict[str, Any], tokens: list[str]) -> SpecialTokens:
    def token(key: str) -> str | None:
        idx = md.get(f"tokenizer.ggml.{key}")
        return tokens[int(idx)] if idx is not None and 0 <= int(idx) < len(tokens) else None

    return SpecialTokens(
        bos=token("bos_token_id"),
        eos=token("eos_token_id"),
        unk=token("unknown_token_id"),
        pad=token("padding_token_id"),
    )


def _with_defaults(md: dict[str, Any]) -> dict[str, Any]:
    """``md`` with llama.cpp's defaults filled in for a SentencePiece vocabulary."""
    return {**_SPM_DEFAULTS, **md} if md.get("tokenizer.ggml.model") == "llama" else md


def build_tokenizer(md: dict[str, Any]) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` equivalent to the GGUF vocabulary (byte-level BPE or SentencePiece)."""
    kind = md.get("tokenizer.ggml.model")
    if kind == "llama":
        return _build_sentencepiece(_with_defaults(md))
    if kind != "gpt2":
        raise GGUFImportError(f"GGUF tokenizer model {kind!r} is not supported; supported: {_SUPPORTED_MODELS}")
    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFImportError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(_PRE_TOKENIZERS)}"
        )
    tokens: list[str] = md["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    types: list[int] = md.get("tokenizer.ggml.token_type", [_TOKEN_NORMAL] * len(tokens))

    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=merges,
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=pre in _IGNORE_MERGES,
        )
    )
    tok.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()

    special = [t for t, ty in zip(tokens, types, strict=False) if ty in (_TOKEN_CONTROL, _TOKEN_UNKNOWN)]
    user = [t for t, ty in zip(tokens, types, strict=False) if ty == _TOKEN_USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    specials = _special_tokens(md, tokens)
    if md.get("tokenizer.ggml.add_bos_token", False) and specials.bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{specials.bos} $A",
            pair=f"{specials.bos} $A {specials.bos}:1 $B:1",
            special_tokens=[(specials.bos, int(md["tokenizer.ggml.bos_token_id"]))],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


# --------------------------------------------------------------------------------------------
# SentencePiece
# --------------------------------------------------------------------------------------------


def _token_list(md: dict[str, Any], key: str, default: Any, count: int) -> list[Any]:
    values = md.get(key)
    if values is None:
        return [default] * count
    if len(values) != count:
        raise GGUFImportError(f"GGUF {key} has {len(values)} entries for {count} tokens; file is damaged")
    return list(values)


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's score-driven joining.

    Every split of a normal piece into two normal pieces is a merge; a merge's rank is its merged
    piece's score (higher first), so the HF model always applies the pair SentencePiece would
    pick. Equal scores keep the lower id first; SentencePiece would take the leftmost pair, which
    no rank order can express, but trained vocabularies give every piece its own score.

    Only normal pieces take part: SentencePiece never joins control, byte or unknown pieces, and
    matches user-defined ones whole (added tokens here). Unused pieces are left out too; SentencePiece
    may join through one and split it back afterwards, which pairwise merges cannot express.
    """
    normal = {t: i for i, t in enumerate(tokens) if types[i] == _TOKEN_NORMAL}
    merges: list[tuple[str, str]] = []
    for piece, _ in sorted(normal.items(), key=lambda item: (-float(scores[item[1]]), item[1])):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                merges.append((left, right))
    return merges


def _literal(text: str) -> str:
    """``text`` as an Oniguruma pattern that matches it literally."""
    return "".join(c if c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


def _dummy_prefix(user_defined: list[str]) -> normalizers.Normalizer:
    """SentencePiece's dummy prefix: a "▁" in front of the space-escaped text.

    User-defined tokens are matched in the normalized text, as SentencePiece matches them, against
    their own text normalized the same way. So that their pattern does not gain the prefix too, a
    text that is exactly one user-defined token gets none (SentencePiece would put a "▁" first).
    """
    if not user_defined:
        return normalizers.Prepend(_SPACE)
    alternatives = "|".join(_literal(t.replace(" ", _SPACE)) for t in user_defined)
    return normalizers.Replace(Regex(rf"\A(?!(?:{alternatives})\z)"), _SPACE)


def _spm_post_processor(md: dict[str, Any], specials: SpecialTokens) -> processors.PostProcessor | None:
    ids: dict[str, int] = {}
    first: list[str] = []
    last: list[str] = []
    if md.get("tokenizer.ggml.add_bos_token") and specials.bos is not None:
        first.append(specials.bos)
        ids[specials.bos] = int(md["tokenizer.ggml.bos_token_id"])
    if md.get("tokenizer.ggml.add_eos_token") and specials.eos is not None:
        last.append(specials.eos)
        ids[specials.eos] = int(md["tokenizer.ggml.eos_token_id"])
    if not ids:
        return None
    second = [f"{t}:1" for t in first] + ["$B:1"] + [f"{t}:1" for t in last]
    return processors.TemplateProcessing(
        single=[*first, "$A", *last],
        pair=[*first, "$A", *last, *second],
        special_tokens=list(ids.items()),
    )


def _build_sentencepiece(md: dict[str, Any]) -> Tokenizer:
    tokens: list[str] = md["tokenizer.ggml.tokens"]
    scores = _token_list(md, "tokenizer.ggml.scores", 0.0, len(tokens))
    types = _token_list(md, "tokenizer.ggml.token_type", _TOKEN_NORMAL, len(tokens))
    specials = _special_tokens(md, tokens)
    unk = specials.unk or next((t for t, ty in zip(tokens, types, strict=True) if ty == _TOKEN_UNKNOWN), None)

    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=_spm_merges(tokens, scores, types),
            unk_token=unk,
            # SentencePiece emits one unknown piece for a run of characters it cannot encode.
            fuse_unk=True,
            byte_fallback=_TOKEN_BYTE in types,
        )
    )
    # No pre-tokenizer: SentencePiece joins pieces across the whole text, spaces included
    # (a vocabulary may hold pieces such as "▁▁").
    user = [t for t, ty in zip(tokens, types, strict=True) if ty == _TOKEN_USER_DEFINED]
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", _SPACE)]
    if md["tokenizer.ggml.add_space_prefix"]:
        steps.append(_dummy_prefix(user))
    tok.normalizer = normalizers.Sequence(steps)

    # This layout is the one mlx-lm recognizes for its streaming SentencePiece detokenizer.
    parts: list[decoders.Decoder] = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if md["tokenizer.ggml.add_space_prefix"]:
        parts.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(parts)

    # Control tokens split the raw text, so each piece of text between them gets its own dummy
    # prefix, as llama.cpp tokenizes it; user-defined tokens are found in the normalized text.
    special = [t for t, ty in zip(tokens, types, strict=True) if ty in (_TOKEN_CONTROL, _TOKEN_UNKNOWN)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=True) for t in user])

    tok.post_processor = _spm_post_processor(md, specials)
    return tok


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def build_tokenizer_config(md: dict[str, Any], context_length: int) -> dict[str, Any]:
    md = _with_defaults(md)
    specials = _special_tokens(md, md["tokenizer.ggml.tokens"])
    config: dict[str, Any] = {
        # The generic class loads tokenizer.json as it is; transformers' LlamaTokenizer would
        # replace the normalizer built here.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    for key, value in (
        ("bos_token", specials.bos),
        ("eos_token", specials.eos),
        ("unk_token", specials.unk),
        ("pad_token", specials.pad),
    ):
        if value is not None:
            config[key] = value
    if template := md.get("tokenizer.chat_template"):
        config["chat_template"] = template
    return config


def build_generation_config(md: dict[str, Any]) -> dict[str, Any]:
    md = _with_defaults(md)
    config: dict[str, Any] = {}
    eos = [int(md[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in md]
    if "tokenizer.ggml.bos_token_id" in md:
        config["bos_token_id"] = int(md["tokenizer.ggml.bos_token_id"])
    if eos:
        unique = list(dict.fromkeys(eos))
        config["eos_token_id"] = unique[0] if len(unique) == 1 else unique
    if "tokenizer.ggml.padding_token_id" in md:
        config["pad_token_id"] = int(md["tokenizer.ggml.padding_token_id"])
    return config
