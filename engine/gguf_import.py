"""Convert a GGUF model file into a plain MLX model folder that ``mlx_lm.load`` reads.

The folder holds ``config.json``, ``model.safetensors`` (float16, F32 tensors kept F32),
``tokenizer.json``/``tokenizer_config.json`` built from the GGUF vocabulary,
``chat_template.jinja`` and ``generation_config.json``.

The GGUF header is parsed here (the format is small) so that unsupported files are refused
with a precise message before any tensor data is touched; the tensors themselves are read by
``mx.load``, which understands F32, F16, Q4_0, Q4_1 and Q8_0 only.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors


class GGUFImportError(ValueError):
    """The GGUF file cannot be converted (unsupported content or a damaged file)."""


# --------------------------------------------------------------------------------------------
# GGUF header
# --------------------------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"

# ggml tensor type ids (ggml.h); ids missing here were removed from ggml.
GGML_TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
    22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}  # fmt: skip

# What mx.load can decode, with the bit width of the quantized ones.
SUPPORTED_TENSOR_TYPES: dict[str, int | None] = {
    "F32": None, "F16": None, "Q4_0": 4, "Q4_1": 4, "Q8_0": 8,
}  # fmt: skip

# GGUF metadata value types: id -> struct format (scalars only).
_SCALAR_FORMATS: dict[int, str] = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: innermost dimension first
    type_id: int

    @property
    def type_name(self) -> str:
        return GGML_TYPE_NAMES.get(self.type_id, f"type#{self.type_id}")


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[GGUFTensorInfo]

    def tensor_names(self) -> set[str]:
        return {t.name for t in self.tensors}


class _Cursor:
    """Sequential little-endian reader over a memory-mapped file."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        if fmt == "<f":  # shortest decimal that round-trips as float32: 1e-05, not 9.99999974e-06
            value = float(str(np.float32(value)))
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        if self.pos + length > len(self.buf):
            raise GGUFImportError("GGUF file is truncated (string runs past the end)")
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, type_id: int) -> Any:
        if type_id in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[type_id])
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type = self.scalar("<I")
            count = self.scalar("<Q")
            if count > len(self.buf):
                raise GGUFImportError(f"GGUF metadata array claims {count} items; file is damaged")
            return [self.value(item_type) for _ in range(count)]
        raise GGUFImportError(f"GGUF metadata value type {type_id} is unknown; file is damaged")


def read_gguf_header(path: Path) -> GGUFHeader:
    """Parse the GGUF header (metadata and tensor table) without reading tensor data."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # empty file
            raise GGUFImportError(f"{path} is not a GGUF file (empty)") from e
    with buf:
        if buf[:4] != GGUF_MAGIC:
            raise GGUFImportError(f"{path} is not a GGUF file (bad magic {bytes(buf[:4])!r})")
        cur = _Cursor(buf)
        cur.pos = 4
        try:
            version = cur.scalar("<I")
            if version not in (2, 3):
                raise GGUFImportError(f"GGUF version {version} is not supported (only 2 and 3)")
            n_tensors = cur.scalar("<Q")
            n_kv = cur.scalar("<Q")
            metadata: dict[str, Any] = {}
            for _ in range(n_kv):
                key = cur.string()
                metadata[key] = cur.value(cur.scalar("<I"))
            tensors = []
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.scalar("<I")
                shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
                type_id = cur.scalar("<I")
                cur.scalar("<Q")  # data offset: mx.load resolves it
                tensors.append(GGUFTensorInfo(name, shape, type_id))
        except struct.error as e:
            raise GGUFImportError(f"GGUF file {path} is truncated or damaged: {e}") from e
    return GGUFHeader(version, metadata, tensors)


def check_tensor_types(header: GGUFHeader) -> None:
    """Refuse tensor types that mx.load cannot decode, naming them and their tensors."""
    unsupported: dict[str, list[str]] = {}
    for t in header.tensors:
        if t.type_name not in SUPPORTED_TENSOR_TYPES:
            unsupported.setdefault(t.type_name, []).append(t.name)
    if not unsupported:
        return

    def listing(names: list[str]) -> str:
        return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")

    if len(unsupported) == 1:
        [(type_name, names)] = unsupported.items()
        problem = f"type {type_name} is not supported (tensors: {listing(names)})"
    else:
        each = ", ".join(f"{t} (tensors: {listing(names)})" for t, names in unsupported.items())
        problem = f"types {each} are not supported"
    raise GGUFImportError(f"GGUF tensor {problem}; supported: {', '.join(SUPPORTED_TENSOR_TYPES)}")


# --------------------------------------------------------------------------------------------
# Architectures
# --------------------------------------------------------------------------------------------

# Per-layer GGUF tensor suffix -> mlx-lm (HF) name inside ``model.layers.N``.
_LAYER_NAMES: dict[str, str] = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


@dataclass(frozen=True)
class ArchSpec:
    """How one GGUF architecture maps onto an mlx-lm model type."""

    model_type: str
    architecture: str  # HF class name for config.json
    # llama.cpp's converter reorders Q/K rows of llama models for its rope; undo it.
    permute_qk: bool = False
    extra_layer_names: dict[str, str] = field(default_factory=dict)
    extra_config: Callable[[_Meta, GGUFHeader], dict[str, Any]] | None = None

    def layer_names(self) -> dict[str, str]:
        return {**_LAYER_NAMES, **self.extra_layer_names}


class _Meta:
    """Typed access to ``<arch>.*`` hyperparameters with clear errors for missing keys."""

    def __init__(self, metadata: dict[str, Any], arch: str) -> None:
        self.metadata = metadata
        self.arch = arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{key}", default)

    def require(self, key: str) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.metadata:
            raise GGUFImportError(f"GGUF metadata lacks {full}")
        return self.metadata[full]

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default) if default is not None else self.require(key)
        if isinstance(value, list):  # per-layer values (e.g. varying kv heads)
            raise GGUFImportError(f"GGUF metadata {self.arch}.{key} varies per layer; not supported")
        return int(value)


def _bias_config(meta: _Meta, header: GGUFHeader) -> dict[str, Any]:
    names = header.tensor_names()
    return {"attention_bias": "blk.0.attn_q.bias" in names, "mlp_bias": "blk.0.ffn_up.bias" in names}


ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec("llama", "LlamaForCausalLM", permute_qk=True, extra_config=_bias_config),
    "qwen2": ArchSpec("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ArchSpec(
        "qwen3",
        "Qwen3ForCausalLM",
        extra_layer_names={
            "attn_q_norm.weight": "self_attn.q_norm.weight",
            "attn_k_norm.weight": "self_attn.k_norm.weight",
        },
    ),
}


def arch_spec(header: GGUFHeader) -> ArchSpec:
    arch = header.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[arch]


def build_config(header: GGUFHeader, spec: ArchSpec) -> dict[str, Any]:
    """config.json for mlx-lm from the ``<arch>.*`` metadata."""
    md = header.metadata
    meta = _Meta(md, md["general.architecture"])
    if meta.get("expert_count", 0):
        raise GGUFImportError("mixture-of-experts GGUF models are not supported")
    hidden = meta.integer("embedding_length")
    n_heads = meta.integer("attention.head_count")
    head_dim = meta.integer("attention.key_length", hidden // n_heads)
    rope_dim = meta.integer("rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise GGUFImportError(f"partial rotary embeddings ({rope_dim} of {head_dim}) are not supported")
    if "rope_freqs.weight" in header.tensor_names():
        raise GGUFImportError("GGUF rope frequency tables (rope_freqs.weight) are not supported")

    embed = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise GGUFImportError("GGUF file has no token_embd.weight tensor")
    context = meta.integer("context_length", 4096)
    config: dict[str, Any] = {
        "model_type": spec.model_type,
        "architectures": [spec.architecture],
        "hidden_size": hidden,
        "intermediate_size": meta.integer("feed_forward_length"),
        "num_hidden_layers": meta.integer("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.integer("attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(meta.require("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get("rope.freq_base", 10000.0)),
        "max_position_embeddings": context,
        "vocab_size": embed.shape[1],  # GGUF shape is (hidden, vocab)
        "tie_word_embeddings": "output.weight" not in header.tensor_names(),
        "hidden_act": "silu",
        "torch_dtype": "float16",
    }
    rope_scaling = _rope_scaling(meta)
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    for key in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" in md:
            config[key] = int(md[f"tokenizer.ggml.{key}"])
    if spec.extra_config:
        config.update(spec.extra_config(meta, header))
    return config


def _rope_scaling(meta: _Meta) -> dict[str, Any] | None:
    kind = meta.get("rope.scaling.type", "none")
    factor = float(meta.get("rope.scaling.factor", 1.0))
    if kind == "none" or factor == 1.0:
        return None
    if kind == "linear":
        return {"type": "linear", "factor": factor}
    raise GGUFImportError(f"GGUF rope scaling {kind!r} is not supported")


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def _mlx_name(gguf_name: str, spec: ArchSpec) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in spec.layer_names():
        return f"model.layers.{m.group(1)}.{spec.layer_names()[m.group(2)]}"
    return None


def _unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Inverse of llama.cpp's ``permute``: rows per head go from (half, 2) back to (2, half)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_tensor(raw: dict[str, mx.array], info: GGUFTensorInfo) -> mx.array:
    """One tensor as float16 (F32 stays float32); quantized ones are dequantized."""
    bits = SUPPORTED_TENSOR_TYPES[info.type_name]
    if bits is None:
        return raw[info.name]
    # mx.load returns quantized tensors as <base>.weight, <base>.scales, <base>.biases.
    base = info.name.removesuffix(".weight")
    scales, biases = raw[f"{base}.scales"], raw[f"{base}.biases"]
    # Dequantize in float32 so the only rounding is the final one to float16.
    w = mx.dequantize(
        raw[info.name], scales.astype(mx.float32), biases.astype(mx.float32), group_size=32, bits=bits
    )
    return w.astype(mx.float16)


def convert_weights(
    gguf_path: Path, header: GGUFHeader, spec: ArchSpec, config: dict[str, Any]
) -> dict[str, mx.array]:
    """All tensors under mlx-lm names, dequantized, with Q/K rows back in HF order."""
    unknown = [t.name for t in header.tensors if _mlx_name(t.name, spec) is None]
    if unknown:
        shown = ", ".join(unknown[:6]) + (", ..." if len(unknown) > 6 else "")
        raise GGUFImportError(f"GGUF tensors not understood for {spec.model_type}: {shown}")

    raw = mx.load(str(gguf_path))
    weights: dict[str, mx.array] = {}
    for info in header.tensors:
        name = _mlx_name(info.name, spec)
        assert name is not None
        w = _load_tensor(raw, info)
        if spec.permute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = _unpermute_rows(w, config["num_attention_heads"])
        elif spec.permute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = _unpermute_rows(w, config["num_key_value_heads"])
        weights[name] = w
    mx.eval(weights)
    return weights


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

# llama.cpp token types (llama_token_type).
_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 2, 3, 4

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


def build_tokenizer(md: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` equivalent to the GGUF vocabulary."""
    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFImportError(
            f"GGUF tokenizer model {kind!r} is not supported; supported: gpt2 (byte-level BPE)"
        )
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


def build_tokenizer_config(md: dict[str, Any], context_length: int) -> dict[str, Any]:
    specials = _special_tokens(md, md["tokenizer.ggml.tokens"])
    config: dict[str, Any] = {
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


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def import_gguf(gguf_path: Path, dest: Path) -> None:
    """Convert ``gguf_path`` into an MLX model folder at ``dest``.

    Raises GGUFImportError for anything unsupported. Writes only inside ``dest`` (created if
    needed); on failure the caller removes the partial folder.
    """
    gguf_path, dest = Path(gguf_path), Path(dest)
    header = read_gguf_header(gguf_path)
    check_tensor_types(header)
    spec = arch_spec(header)
    config = build_config(header, spec)
    md = header.metadata
    if "tokenizer.ggml.tokens" not in md:
        raise GGUFImportError("GGUF file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    tokenizer = build_tokenizer(md)
    weights = convert_weights(gguf_path, header, spec, config)

    dest.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    _write_json(dest / "config.json", config)
    tokenizer.save(str(dest / "tokenizer.json"))
    _write_json(dest / "tokenizer_config.json", build_tokenizer_config(md, config["max_position_embeddings"]))
    if template := md.get("tokenizer.chat_template"):
        (dest / "chat_template.jinja").write_text(template, encoding="utf-8")
    _write_json(dest / "generation_config.json", build_generation_config(md))
