"""How each GGUF architecture maps onto an mlx-lm model: tensor names, config.json, and the few
changes llama.cpp's converter made to the weights that must be undone.

Shapes here are in numpy order (rows first), as the gguf reader's arrays are: a linear layer's
weight is (out, in), the embedding (vocab, hidden).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swama.engine.errors import GGUFImportError

Shapes = dict[str, tuple[int, ...]]

# Per-layer GGUF tensor suffix -> mlx-lm (Hugging Face) name inside ``model.layers.N``.
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
_QK_NORMS = {"attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight"}
_GEMMA_NORMS = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_PHI3_NAMES = {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}
_GLOBAL_NAMES: dict[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


class Meta:
    """Typed access to the ``<arch>.*`` hyperparameters, with clear errors for missing keys."""

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


# Small tensors that are configuration, not weights: name -> their values (numpy float32).
ConfigTensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class ArchSpec:
    """How one GGUF architecture maps onto an mlx-lm model type."""

    model_type: str
    architecture: str  # Hugging Face class name for config.json
    hidden_act: str = "silu"
    # llama.cpp's converter reorders Q/K rows of llama models for its rope; undo it.
    permute_qk: bool = False
    # Gemma's norms compute x * (1 + w); llama.cpp stores 1 + w, mlx-lm wants w.
    norm_offset: float = 0.0
    layer_names: dict[str, str] = field(default_factory=lambda: dict(_LAYER_NAMES))
    # Tensors read into config.json instead of the weights.
    config_tensors: frozenset[str] = frozenset()
    extra_config: Callable[[Meta, Shapes, ConfigTensors, dict[str, Any]], dict[str, Any]] | None = None

    def mlx_name(self, gguf_name: str) -> str | None:
        if gguf_name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[gguf_name]
        m = _LAYER_RE.fullmatch(gguf_name)
        if m and m.group(2) in self.layer_names:
            return f"model.layers.{m.group(1)}.{self.layer_names[m.group(2)]}"
        return None

    def changes(self, name: str) -> bool:
        """Whether ``transform`` changes this tensor (the mlx-lm name)."""
        permuted = self.permute_qk and name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias"))
        return permuted or bool(self.norm_offset and name.endswith("norm.weight"))

    def transform(self, name: str, values: np.ndarray, config: dict[str, Any]) -> np.ndarray:
        """Undo llama.cpp's changes to one tensor (``name`` is the mlx-lm name)."""
        if self.permute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
            return unpermute_rows(values, config["num_attention_heads"])
        if self.permute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
            return unpermute_rows(values, config["num_key_value_heads"])
        if self.norm_offset and name.endswith("norm.weight"):
            return values - np.float32(self.norm_offset)
        return values


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute``: rows per head go from (half, 2) back to (2, half)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _bias_config(meta: Meta, shapes: Shapes, tensors: ConfigTensors, config: dict[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {"attention_bias": "blk.0.attn_q.bias" in shapes, "mlp_bias": "blk.0.ffn_up.bias" in shapes}
    if "rope_freqs.weight" in tensors:
        extra["rope_scaling"] = llama3_rope_scaling(tensors["rope_freqs.weight"], config)
    return extra


# Llama 3.1 / 3.2 files carry their rope scaling only as the per-frequency factors it produces;
# mlx-lm wants its parameters. These are the ones Meta's releases use; the factors must match them.
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def llama3_rope_scaling(factors: np.ndarray, config: dict[str, Any]) -> dict[str, Any]:
    scaling = {"rope_type": "llama3", "factor": float(np.max(factors)), **_LLAMA3_ROPE}
    dims = config["head_dim"]
    inv_freq = config["rope_theta"] ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
    wavelen = 2 * math.pi / inv_freq
    low, high, original = (scaling["low_freq_factor"], scaling["high_freq_factor"],
                           scaling["original_max_position_embeddings"])
    smooth = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
    expected = 1.0 / ((1 - smooth) / scaling["factor"] + smooth)
    if factors.shape != expected.shape or not np.allclose(factors, expected, rtol=1e-3):
        raise GGUFImportError("GGUF rope frequency factors (rope_freqs.weight) do not follow Llama 3's rope "
                              "scaling; this file's rope scaling is not supported")
    return scaling


def _gemma_scalar(meta: Meta, shapes: Shapes, big_layers: int) -> int:
    # llama.cpp scales queries by 1/sqrt(head_dim), except the 27B models, which use hidden / heads.
    if meta.integer("block_count") == big_layers:
        return meta.integer("embedding_length") // meta.integer("attention.head_count")
    return meta.integer("attention.key_length")


def _gemma2_config(meta: Meta, shapes: Shapes, tensors: ConfigTensors, config: dict[str, Any]) -> dict[str, Any]:
    return {"attn_logit_softcapping": float(meta.get("attn_logit_softcapping", 50.0)),
            "final_logit_softcapping": float(meta.get("final_logit_softcapping", 30.0)),
            "query_pre_attn_scalar": _gemma_scalar(meta, shapes, big_layers=46),
            "sliding_window": meta.integer("attention.sliding_window", 4096)}


def _gemma3_config(meta: Meta, shapes: Shapes, tensors: ConfigTensors, config: dict[str, Any]) -> dict[str, Any]:
    # Every sixth layer attends globally unless the file says otherwise (llama.cpp fixes 6 too);
    # local layers use rope base 10000.
    pattern = meta.get("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # newer files: one flag per layer, true for a sliding layer
        pattern = next((i + 1 for i, sliding in enumerate(pattern) if not sliding), len(pattern) + 1)
    return {"query_pre_attn_scalar": _gemma_scalar(meta, shapes, big_layers=62),
            "sliding_window": meta.integer("attention.sliding_window", 512),
            "sliding_window_pattern": int(pattern),
            "rope_local_base_freq": float(meta.get("rope.freq_base_swa", 10000.0))}


def _phi3_config(meta: Meta, shapes: Shapes, tensors: ConfigTensors, config: dict[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "original_max_position_embeddings": meta.integer("rope.scaling.original_context_length",
                                                         config["max_position_embeddings"])}
    if "rope_factors_long.weight" in tensors:
        extra["rope_scaling"] = {"type": "longrope",
                                 "long_factor": tensors["rope_factors_long.weight"].tolist(),
                                 "short_factor": tensors["rope_factors_short.weight"].tolist()}
    return extra


ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec("llama", "LlamaForCausalLM", permute_qk=True, config_tensors=frozenset({"rope_freqs.weight"}),
                      extra_config=_bias_config),
    "qwen2": ArchSpec("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ArchSpec("qwen3", "Qwen3ForCausalLM", layer_names={**_LAYER_NAMES, **_QK_NORMS}),
    "gemma2": ArchSpec("gemma2", "Gemma2ForCausalLM", hidden_act="gelu_pytorch_tanh", norm_offset=1.0,
                       layer_names={**_LAYER_NAMES, **_GEMMA_NORMS}, extra_config=_gemma2_config),
    "gemma3": ArchSpec("gemma3_text", "Gemma3ForCausalLM", hidden_act="gelu_pytorch_tanh", norm_offset=1.0,
                       layer_names={**_LAYER_NAMES, **_GEMMA_NORMS, **_QK_NORMS}, extra_config=_gemma3_config),
    "phi3": ArchSpec("phi3", "Phi3ForCausalLM", layer_names={**_LAYER_NAMES, **_PHI3_NAMES},
                     config_tensors=frozenset({"rope_factors_long.weight", "rope_factors_short.weight"}),
                     extra_config=_phi3_config),
}


def arch_spec(metadata: dict[str, Any]) -> ArchSpec:
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(f"GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[arch]


def build_config(metadata: dict[str, Any], spec: ArchSpec, shapes: Shapes, tensors: ConfigTensors) -> dict[str, Any]:
    """config.json for mlx-lm from the ``<arch>.*`` metadata and the tensor shapes."""
    meta = Meta(metadata, metadata["general.architecture"])
    if meta.get("expert_count", 0):
        raise GGUFImportError("mixture-of-experts GGUF models are not supported")
    hidden = meta.integer("embedding_length")
    n_heads = meta.integer("attention.head_count")
    head_dim = meta.integer("attention.key_length", hidden // n_heads)
    rope_dim = meta.integer("rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise GGUFImportError(f"partial rotary embeddings ({rope_dim} of {head_dim}) are not supported")
    if "token_embd.weight" not in shapes:
        raise GGUFImportError("GGUF file has no token_embd.weight tensor")
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
        "max_position_embeddings": meta.integer("context_length", 4096),
        "vocab_size": shapes["token_embd.weight"][0],
        "tie_word_embeddings": "output.weight" not in shapes,
        "hidden_act": spec.hidden_act,
    }
    if rope_scaling := _rope_scaling(meta):
        config["rope_scaling"] = rope_scaling
    for key in ("bos_token_id", "eos_token_id"):
        if f"tokenizer.ggml.{key}" in metadata:
            config[key] = int(metadata[f"tokenizer.ggml.{key}"])
    if spec.extra_config:
        config.update(spec.extra_config(meta, shapes, tensors, config))
    return config


def _rope_scaling(meta: Meta) -> dict[str, Any] | None:
    kind = meta.get("rope.scaling.type", "none")
    factor = float(meta.get("rope.scaling.factor", 1.0))
    if kind == "none" or factor == 1.0:
        return None
    if kind == "linear":
        return {"type": "linear", "factor": factor}
    raise GGUFImportError(f"GGUF rope scaling {kind!r} is not supported")
