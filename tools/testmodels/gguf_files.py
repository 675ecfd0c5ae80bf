"""Tiny random models of each architecture the GGUF importer supports, written to GGUF with the
gguf package's writer in llama.cpp's layout.

What llama.cpp's converter (convert_hf_to_gguf.py) does to a Hugging Face model is restated here
on its own, not taken from the importer: tensor names, the Q/K row permutation of llama models,
Gemma's stored norm weights (1 + w), and which tensors stay F32 (the vectors).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

from tools.testmodels.kquants import quantize as kquantize

ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
MODEL_TYPES = {"gemma3": "gemma3_text"}


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest shift up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


# A byte-level BPE vocabulary: the 256 byte symbols, three merges, two control tokens.
TINY_MERGES = ["Ġ t", "h e", "Ġt he"]
TINY_TOKENS = [*_byte_symbols(), "Ġt", "he", "Ġthe", "<|im_start|>", "<|im_end|>"]
TINY_TOKEN_TYPES = [1] * (len(TINY_TOKENS) - 2) + [3, 3]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def tokenizer_metadata(pre: str = "smollm") -> dict[str, Any]:
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": TINY_TOKENS,
        "tokenizer.ggml.token_type": TINY_TOKEN_TYPES,
        "tokenizer.ggml.merges": TINY_MERGES,
        "tokenizer.ggml.bos_token_id": len(TINY_TOKENS) - 2,
        "tokenizer.ggml.eos_token_id": len(TINY_TOKENS) - 1,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def tiny_config(arch: str, hidden: int = 256) -> dict[str, Any]:
    """mlx-lm config of a tiny model; 256 wide so every K-quant block (256 values) fits a row."""
    config: dict[str, Any] = {
        "model_type": MODEL_TYPES.get(arch, arch),
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0,
        "max_position_embeddings": 2048,
        "vocab_size": len(TINY_TOKENS),
        "tie_word_embeddings": arch in ("gemma2", "gemma3", "qwen3"),
    }
    if arch == "gemma2":
        config.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=hidden // 4)
    if arch == "gemma3":
        # mlx-lm reads the global-attention mask from layer pattern - 1: the model needs that many.
        config["num_hidden_layers"] = 6
        config.update(query_pre_attn_scalar=hidden // 4, sliding_window=512, sliding_window_pattern=6,
                      rope_local_base_freq=10000.0)
    if arch == "phi3":
        config.update(original_max_position_embeddings=2048)
    return config


def source_weights(arch: str, seed: int = 1, hidden: int = 256) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The tiny model's config and random float32 weights (mlx-lm names, numpy arrays)."""
    config = tiny_config(arch, hidden)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    weights = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())}
    rng = np.random.default_rng(seed)
    for name, w in weights.items():
        # mlx initializes norms to ones (or zeros for Gemma's 1 + w): perturb them so a norm that is
        # mapped wrong, or offset twice, shows.
        if name.endswith("norm.weight"):
            weights[name] = (w + rng.normal(0, 0.1, w.shape)).astype(np.float32)
    return config, weights


def load_source(config: dict[str, Any], weights: dict[str, np.ndarray]) -> Any:
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()])
    return model


# Hugging Face (mlx-lm) names -> llama.cpp's, per architecture.
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
}  # fmt: skip
_GEMMA_LAYER = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def llama_cpp_name(arch: str, name: str) -> str:
    if name in _GLOBAL:
        return _GLOBAL[name]
    _, _, layer, rest = name.split(".", 3)
    table = {**_LAYER, **_GEMMA_LAYER} if arch.startswith("gemma") else _LAYER
    return f"blk.{layer}.{table[rest]}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_values(arch: str, name: str, w: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    """The values llama.cpp's converter stores for one Hugging Face tensor."""
    if arch == "llama" and name.endswith("q_proj.weight"):
        return llama_cpp_permute(w, config["num_attention_heads"])
    if arch == "llama" and name.endswith("k_proj.weight"):
        return llama_cpp_permute(w, config["num_key_value_heads"])
    if arch.startswith("gemma") and name.endswith("norm.weight"):
        return w + np.float32(1.0)
    return w


K_QUANTS = {Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS}


def encode(values: np.ndarray, qtype: Q) -> np.ndarray:
    """Bytes (or floats) of one tensor in ``qtype``: the gguf package's quantizer where it has one,
    the tests' own K-quant encoder where it does not."""
    if qtype in K_QUANTS:
        return kquantize(values, qtype)
    return gguf.quants.quantize(values, qtype)


def decoded(values: np.ndarray, qtype: Q) -> np.ndarray:
    """What the file's bytes decode to (float32, same shape)."""
    return gguf.quants.dequantize(encode(values, qtype), qtype).reshape(values.shape).astype(np.float32)


def _arch_metadata(writer: gguf.GGUFWriter, arch: str, c: dict[str, Any]) -> None:
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(c["num_key_value_heads"])
    writer.add_key_length(c["head_dim"])
    writer.add_value_length(c["head_dim"])
    writer.add_rope_dimension_count(c["head_dim"])
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_rope_freq_base(c["rope_theta"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(c["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(c["final_logit_softcapping"])
    if arch in ("gemma2", "gemma3"):
        writer.add_sliding_window(c.get("sliding_window", 4096))
    if arch == "phi3":
        writer.add_rope_scaling_orig_ctx_len(c["original_max_position_embeddings"])


def _tokenizer(writer: gguf.GGUFWriter, md: dict[str, Any]) -> None:
    writer.add_tokenizer_model(md["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in md:
        writer.add_tokenizer_pre(md["tokenizer.ggml.pre"])
    writer.add_token_list(md["tokenizer.ggml.tokens"])
    writer.add_token_types(md["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in md:
        writer.add_token_merges(md["tokenizer.ggml.merges"])
    if "tokenizer.ggml.scores" in md:
        writer.add_token_scores(md["tokenizer.ggml.scores"])
    writer.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    writer.add_chat_template(md["tokenizer.chat_template"])


TypeFor = Callable[[str, np.ndarray], Q]


def matrices_as(qtype: Q) -> TypeFor:
    """llama.cpp's habit: vectors (norms, biases) stay F32, matrices take the file's type."""
    return lambda name, w: qtype if w.ndim == 2 else Q.F32


Raw = tuple[np.ndarray, Q | None]  # a tensor's data as stored, and its type when the data is bytes


def write_gguf(path: Path, arch: str, config: dict[str, Any], weights: dict[str, np.ndarray], type_for: TypeFor,
               tokenizer: dict[str, Any] | None = None, extra: dict[str, Raw] | None = None,
               file_type: gguf.LlamaFileType | None = None) -> Path:
    """Write the model as llama.cpp would; returns ``path``. ``extra`` adds tensors by GGUF name."""
    writer = gguf.GGUFWriter(path, arch)
    if file_type is not None:
        writer.add_file_type(int(file_type))
    _arch_metadata(writer, arch, config)
    _tokenizer(writer, tokenizer or tokenizer_metadata())
    for name, w in weights.items():
        values = llama_cpp_values(arch, name, w, config)
        qtype = type_for(name, values)
        data = encode(values, qtype)
        raw = None if data.dtype in (np.float32, np.float16) else qtype  # byte data says its type
        writer.add_tensor(llama_cpp_name(arch, name), data, raw_dtype=raw)
    for name, (data, qtype) in (extra or {}).items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
