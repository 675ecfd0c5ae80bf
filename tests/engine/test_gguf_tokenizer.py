"""GGUF vocabularies to HF tokenizers: SentencePiece ones checked against SentencePiece itself.

Real SentencePiece BPE models are trained here on a small corpus, turned into GGUF tokenizer
metadata the way llama.cpp's convert_hf_to_gguf.py does, and the tokenizer built from that
metadata must encode and decode every text exactly as SentencePiece does.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_model
from tokenizers import Tokenizer

from swama.engine.errors import GGUFImportError
from swama.engine.files.gguf_tokenizer import build_generation_config, build_tokenizer, build_tokenizer_config

Piece = sp_model.ModelProto.SentencePiece

# --------------------------------------------------------------------------------------------
# Trained SentencePiece models and their GGUF metadata
# --------------------------------------------------------------------------------------------

_SUBJECTS = [
    "The old lighthouse keeper", "A curious child", "Our team of engineers", "The café owner",
    "My neighbour's dog", "Every student", "The orchestra", "A tired traveller", "The committee",
    "Zoë from Zürich", "The naïve intern", "Björn and Chloé",
]
_VERBS = [
    "painted", "discovered", "measured", "ordered", "repaired", "described", "visited", "counted",
    "photographed", "cooked", "wrote about", "forgot",
]
_OBJECTS = [
    "the broken bicycle", "a crème brûlée", "seventeen blue windows", "the façade of the museum",
    "an enormous résumé", "the quiet river", "three hundred lanterns", "the weather report",
    "a piñata", "the übermensch essay", "every single detail", "the garden gate",
]
_ENDINGS = [
    ".", "!", "?", " yesterday.", " in 1987.", " at 10:45 a.m.", " for $3.50.", ", twice.",
    " (again).", " - or so they said.", "; nobody knew why.", " on 2024-06-30.", " with 42% accuracy.",
]


def _corpus() -> list[str]:
    rng = random.Random(20240601)
    lines = []
    for _ in range(1500):
        line = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
        if rng.random() < 0.2:
            line += f" \"Really?\" asked {rng.choice(['Ann', 'José', 'Renée', 'Tom'])}."
        if rng.random() < 0.1:
            line = "  " + line + "  "
        lines.append(line)
    return lines


VOCAB_SIZE = 600


def _train(add_dummy_prefix: bool, **options: Any) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        character_coverage=1.0,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        # Llama 2, Mistral and Gemma: no normalization, whitespace kept as written.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix,
        num_threads=1,
        minloglevel=2,
        **options,
    )
    return model.getvalue()


def gguf_metadata(model: bytes, padded_vocab: int | None = None) -> dict[str, Any]:
    """Tokenizer metadata as convert_hf_to_gguf.py writes it for a SentencePiece model.

    Its token types come from SentencePiece's own flags; user-defined pieces are marked
    user-defined, as the converter marks the added tokens listed in tokenizer_config.json. A
    ``padded_vocab`` larger than the model adds the converter's unused "[PADn]" tokens.
    """
    sp = spm.SentencePieceProcessor(model_proto=model)
    proto = sp_model.ModelProto()
    proto.ParseFromString(model)
    tokens, scores, types = [], [], []
    for i, piece in enumerate(proto.pieces):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_unused(i):
            types.append(5)
        elif sp.is_byte(i):
            types.append(6)
        elif piece.type == Piece.USER_DEFINED:
            types.append(4)
        else:
            types.append(1)
    for i in range(len(tokens), padded_vocab or 0):
        tokens.append(f"[PAD{i}]")
        scores.append(-10000.0)
        types.append(5)
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_space_prefix": proto.normalizer_spec.add_dummy_prefix,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
    }
    if sp.pad_id() >= 0:
        md["tokenizer.ggml.padding_token_id"] = sp.pad_id()
    return md


@dataclass
class Trained:
    sp: spm.SentencePieceProcessor
    md: dict[str, Any]
    tok: Tokenizer
    user_defined: list[str]
    control: list[str]


def _trained(add_dummy_prefix: bool, user_defined: list[str], control: list[str], **options: Any) -> Trained:
    model = _train(add_dummy_prefix, user_defined_symbols=user_defined, control_symbols=control, **options)
    # The Llama-style vocabulary is padded, as the converter pads one shorter than the model's.
    md = gguf_metadata(model, padded_vocab=VOCAB_SIZE + 8 if add_dummy_prefix else None)
    return Trained(spm.SentencePieceProcessor(model_proto=model), md, build_tokenizer(md), user_defined, control)


@pytest.fixture(scope="module")
def llama_style() -> Trained:
    """Dummy prefix on, <unk>=0 <s>=1 </s>=2, Mistral-like control tokens."""
    return _trained(True, ["<ud>"], ["[INST]", "[/INST]"])


@pytest.fixture(scope="module")
def gemma_style() -> Trained:
    """No dummy prefix, <pad>=0 <eos>=1 <bos>=2 <unk>=3, Gemma-like user-defined turn tokens."""
    return _trained(
        False, ["<start_of_turn>", "<end_of_turn>"], ["<mask>"],
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, bos_piece="<bos>", eos_piece="<eos>",
    )


@pytest.fixture(params=["llama_style", "gemma_style"])
def trained(request: pytest.FixtureRequest) -> Trained:
    return request.getfixturevalue(request.param)


# --------------------------------------------------------------------------------------------
# Texts
# --------------------------------------------------------------------------------------------

FIXED_TEXTS = [
    "", " ", "  ", "   ", "\n", "\t", "\r\n",
    "hello", " hello", "  hello", "hello ", "hello  ", " hello ",
    "The quick brown fox jumps over the lazy dog.",
    "double  spaces  between   words", "a    b",
    "line one\nline two", "para\n\nbreak", "\ttabbed\tcolumns\t", "mixed \n\t whitespace",
    "digits 0123456789 and 3.14159, 1,000,000 and 2024-06-30",
    "punctuation: !?;:,.-()[]{}<>\"'/\\|@#$%^&*_+=~`",
    "café naïve façade crème brûlée Zoë Zürich",
    "letters the corpus lacks: ø å ł ß Ω ж",
    "emoji 😀👍🏽🚀 need bytes",
    "中文字符 日本語のテキスト 한국어",
    "mixed 中 and 😀 inside words: a中b 😀x",
    "The café owner repaired the garden gate at 10:45 a.m.",
    "  Every student counted seventeen blue windows.  ",
    "UPPER CASE TEXT AND MiXeD cAsE",
    "[INST ] almost a control token",
    "\u2581 a literal sentencepiece space mark \u2581\u2581",
    "<0x41> looks like a byte token",
    "word" * 30,
    " ".join(["spaces"] * 40),
]


def random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = " ".join(_corpus()[:200]).split()
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFG0123456789      .,;!?-'\"éüñøß中文😀\n\t"
    texts = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 25))))
        elif kind == 1:
            texts.append("".join(rng.choice(words) for _ in range(rng.randint(1, 6))))
        elif kind == 2:
            texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 50))))
        else:
            texts.append(" ".join(w[::-1] for w in rng.sample(words, rng.randint(1, 10))))
    return texts


TEXTS = FIXED_TEXTS + random_texts(400, seed=7) + _corpus()[:100]


# --------------------------------------------------------------------------------------------
# Plain text: the same ids and the same decoded text as SentencePiece
# --------------------------------------------------------------------------------------------


def _mismatches(trained: Trained, texts: list[str]) -> list[tuple[str, list[str], list[str]]]:
    bad = []
    for text in texts:
        ours = trained.tok.encode(text).ids
        theirs = trained.sp.encode(text)
        if ours != theirs:
            bad.append((text, [trained.tok.id_to_token(i) for i in ours], trained.sp.encode(text, out_type=str)))
    return bad


def test_encode_matches_sentencepiece(trained: Trained) -> None:
    assert _mismatches(trained, TEXTS) == []


def test_decode_matches_sentencepiece(trained: Trained) -> None:
    for text in TEXTS:
        ids = trained.sp.encode(text)
        assert trained.tok.decode(ids) == trained.sp.decode(ids), text
        # A "▁" in the text reads back as a space, in SentencePiece too.
        assert trained.tok.decode(ids) == text.replace("\u2581", " "), text


def test_byte_fallback_and_whitespace_pieces(llama_style: Trained) -> None:
    tok = llama_style.tok
    assert tok.encode("😀").tokens == ["\u2581", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert tok.encode("a\nb").tokens[1] == "<0x0A>"
    assert tok.encode("").ids == []
    # The dummy prefix is added even before a leading space.
    assert "".join(tok.encode(" x").tokens).startswith("\u2581\u2581")


def test_without_dummy_prefix(gemma_style: Trained) -> None:
    assert not "".join(gemma_style.tok.encode("hello").tokens).startswith("\u2581")
    assert gemma_style.tok.decode(gemma_style.tok.encode(" hello").ids) == " hello"


def test_missing_add_space_prefix_means_true(llama_style: Trained) -> None:
    md = {k: v for k, v in llama_style.md.items() if k != "tokenizer.ggml.add_space_prefix"}
    tok = build_tokenizer(md)
    for text in FIXED_TEXTS:
        assert tok.encode(text).ids == llama_style.sp.encode(text), text


# --------------------------------------------------------------------------------------------
# Merge order: the merged piece's score decides
# --------------------------------------------------------------------------------------------


def _hand_made_model(pieces: list[tuple[str, float]]) -> bytes:
    """A SentencePiece BPE model with exactly these normal pieces and scores (no training)."""
    proto = sp_model.ModelProto()
    proto.trainer_spec.model_type = sp_model.TrainerSpec.BPE
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    for text, kind in (("<unk>", Piece.UNKNOWN), ("<s>", Piece.CONTROL), ("</s>", Piece.CONTROL)):
        proto.pieces.add(piece=text, score=0.0, type=kind)
    for text, score in pieces:
        proto.pieces.add(piece=text, score=score, type=Piece.NORMAL)
    return proto.SerializeToString()


@pytest.mark.parametrize(
    ("scores", "expected"),
    [((-1.0, 0.0), ["a", "bc"]), ((0.0, -1.0), ["ab", "c"])],
)
def test_higher_scoring_piece_merges_first(scores: tuple[float, float], expected: list[str]) -> None:
    model = _hand_made_model([("ab", scores[0]), ("bc", scores[1]), ("a", -5), ("b", -6), ("c", -7)])
    sp = spm.SentencePieceProcessor(model_proto=model)
    tok = build_tokenizer(gguf_metadata(model))
    assert sp.encode("abc", out_type=str) == expected
    assert tok.encode("abc").tokens == expected


def test_random_vocabularies_merge_like_sentencepiece() -> None:
    """Arbitrary score orders over periodic strings, where the merge order matters most."""
    rng = random.Random(11)
    for trial in range(150):
        alphabet = ["a", "ab", "abc"][trial % 3]
        pieces = set(alphabet)
        size = rng.randint(5, 25)
        for _ in range(200):  # over "a" alone only 8 pieces fit in 8 characters
            if len(pieces) >= size:
                break
            joined = rng.choice(sorted(pieces)) + rng.choice(sorted(pieces))
            if len(joined) <= 8:
                pieces.add(joined)
        longer = sorted(p for p in pieces if len(p) > 1)
        rng.shuffle(longer)
        model = _hand_made_model([(p, -float(i)) for i, p in enumerate([*longer, *alphabet])])
        sp = spm.SentencePieceProcessor(model_proto=model)
        tok = build_tokenizer(gguf_metadata(model))
        for _ in range(40):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
            assert tok.encode(text).ids == sp.encode(text), (longer, text)


# --------------------------------------------------------------------------------------------
# BOS / EOS
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("add_bos", "add_eos"), [(True, False), (False, True), (True, True), (False, False)])
def test_add_bos_and_eos_tokens(trained: Trained, add_bos: bool, add_eos: bool) -> None:
    md = {**trained.md, "tokenizer.ggml.add_bos_token": add_bos, "tokenizer.ggml.add_eos_token": add_eos}
    tok = build_tokenizer(md)
    for text in ["Hello there.", " two  spaces", ""]:
        ids = tok.encode(text).ids
        assert ids == trained.sp.encode(text, add_bos=add_bos, add_eos=add_eos), text
        assert tok.encode(text, add_special_tokens=False).ids == trained.sp.encode(text)
        assert tok.decode(ids) == trained.sp.decode(ids) == text


def test_llama_cpp_defaults_when_keys_are_missing(llama_style: Trained) -> None:
    """Without the keys llama.cpp assumes <unk>=0, <s>=1, </s>=2 and adds BOS."""
    absent = ("bos_token_id", "eos_token_id", "unknown_token_id", "add_bos_token", "add_eos_token")
    md = {k: v for k, v in llama_style.md.items() if k.removeprefix("tokenizer.ggml.") not in absent}
    assert build_tokenizer(md).encode("Hi").ids == llama_style.sp.encode("Hi", add_bos=True)
    config = build_tokenizer_config(md, 2048)
    assert (config["add_bos_token"], config["add_eos_token"]) == (True, False)
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert build_generation_config(md) == {"bos_token_id": 1, "eos_token_id": 2}


# --------------------------------------------------------------------------------------------
# Control and user-defined tokens
# --------------------------------------------------------------------------------------------


def test_control_tokens_in_text_are_special(trained: Trained) -> None:
    """As for byte-level BPE: a control token written in the text is that one token.

    SentencePiece itself would spell it out; the text around it is encoded piece by piece, each
    with its own dummy prefix, as llama.cpp does.
    """
    tok, sp = trained.tok, trained.sp
    for control in trained.control:
        cid = sp.piece_to_id(control)
        assert tok.get_added_tokens_decoder()[cid].special
        ids = tok.encode(f"{control} Hi there {control}Bye").ids
        assert ids == [cid, *sp.encode(" Hi there "), cid, *sp.encode("Bye")]
        assert tok.decode(ids) == sp.decode(ids)
        assert control in tok.decode(ids, skip_special_tokens=False)
    for special in (sp.bos_id(), sp.eos_id(), sp.unk_id()):
        piece = sp.id_to_piece(special)
        assert tok.encode(piece).ids == [special]
        assert tok.get_added_tokens_decoder()[special].special


def test_user_defined_tokens_match_sentencepiece(trained: Trained) -> None:
    tok, sp = trained.tok, trained.sp
    first, last = trained.user_defined[0], trained.user_defined[-1]
    texts = [
        f"a{first}b", f"{first}x", f"x {first} y", f"{first}{last}", f"{first}user\nHi there{last}\n",
        f"  {first}  ", f"text{last}", f"{first}{first}{first}",
    ]
    for text in texts:
        assert tok.encode(text).ids == sp.encode(text), text
        assert tok.decode(sp.encode(text)) == sp.decode(sp.encode(text)) == text
    for user in trained.user_defined:
        assert not tok.get_added_tokens_decoder()[sp.piece_to_id(user)].special


def test_lone_user_defined_token_gets_no_dummy_prefix(llama_style: Trained) -> None:
    """The one known difference: SentencePiece gives ["▁", "<ud>"] for the text "<ud>" alone."""
    ud = llama_style.sp.piece_to_id("<ud>")
    assert llama_style.sp.encode("<ud>") == [llama_style.sp.piece_to_id("\u2581"), ud]
    assert llama_style.tok.encode("<ud>").ids == [ud]
    assert llama_style.tok.decode([ud]) == "<ud>"


# --------------------------------------------------------------------------------------------
# Configs, refusals, and the saved folder as mlx-lm loads it
# --------------------------------------------------------------------------------------------


def test_configs(gemma_style: Trained) -> None:
    md = {**gemma_style.md, "tokenizer.ggml.add_bos_token": True, "tokenizer.chat_template": "{{ x }}"}
    config = build_tokenizer_config(md, 8192)
    assert config == {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "chat_template": "{{ x }}",
    }
    assert build_generation_config(md) == {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}


def test_unsupported_tokenizer_model_is_refused() -> None:
    md = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[UNK]", "hello"]}
    with pytest.raises(GGUFImportError, match=r"tokenizer model 'bert' is not supported") as refused:
        build_tokenizer(md)
    assert "gpt2" in str(refused.value) and "llama" in str(refused.value)


def test_damaged_scores_are_refused(llama_style: Trained) -> None:
    md = {**llama_style.md, "tokenizer.ggml.scores": llama_style.md["tokenizer.ggml.scores"][:-1]}
    with pytest.raises(GGUFImportError, match="tokenizer.ggml.scores"):
        build_tokenizer(md)


@pytest.mark.parametrize("style", ["llama_style", "gemma_style"])
def test_saved_folder_loads_in_mlx_lm(request: pytest.FixtureRequest, tmp_path: Path, style: str) -> None:
    """tokenizer.json as written, read by transformers through mlx-lm, with its SPM detokenizer."""
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    trained: Trained = request.getfixturevalue(style)
    md = {**trained.md, "tokenizer.ggml.add_bos_token": True}
    build_tokenizer(md).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(build_tokenizer_config(md, 4096)))
    wrapper = load_tokenizer(tmp_path)
    detokenizer = wrapper.detokenizer
    assert isinstance(detokenizer, SPMStreamingDetokenizer)
    assert detokenizer.trim_space == md["tokenizer.ggml.add_space_prefix"]
    first, last = trained.user_defined[0], trained.user_defined[-1]
    for text in [*FIXED_TEXTS, *random_texts(40, seed=3), f"{first}user\nHi there{last}", f"a {first}b"]:
        ids = wrapper.encode(text)
        assert ids == trained.sp.encode(text, add_bos=True), text
        assert wrapper.decode(ids, skip_special_tokens=True) == trained.sp.decode(ids), text
        detokenizer.reset()
        for token in ids[1:]:
            detokenizer.add_token(token)
        detokenizer.finalize()
        assert detokenizer.text == trained.sp.decode(ids), text
