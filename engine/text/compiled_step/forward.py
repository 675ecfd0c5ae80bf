"""The traced decode step of a dense decoder: qwen3, qwen2 and llama (full attention only).

Their layers are alike: RMSNorm, attention (query/key/value projections, qwen3's per-head RMSNorm
of queries and keys, RoPE at each row's own position, grouped-query attention), RMSNorm, a SwiGLU
MLP, each with a residual. `DenseDecoder.step` runs one token for every slot of a `SlotStore`:
each row's new key and value are written at its `end`, and it attends to its positions
`start .. end` (attention.py: one CUDA kernel on NVIDIA GPUs, MLX's masked attention elsewhere).
The function is traced by `mx.compile` once per (slots, capacity) shape; the weights are captured
as constants, so a call passes only the tokens, the lengths and the storage.
The model's own modules do the norms, RoPE, the output projections and the head, so the math is
mlx-lm's; only the fused projections and the storage are this package's.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from swama.engine.text.compiled_step.attention import (
    kernel_agrees,
    kernel_available,
    masked_attention,
    span_attention,
)
from swama.engine.text.compiled_step.fusion import Fused, fusable, fuse, projection

FAMILIES = ("qwen3", "qwen2", "llama")
log = logging.getLogger("swama.engine")


def _family(model: Any) -> str | None:
    module = type(model).__module__
    name = module.rsplit(".", 1)[-1]
    if not module.startswith("mlx_lm.models.") or name not in FAMILIES:
        return None
    return name


def why_not(model: Any) -> str | None:
    """Why `model` cannot take the compiled step (None: it can)."""
    name = _family(model)
    if name is None:
        return f"{type(model).__module__} is not one of the families {', '.join(FAMILIES)}"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None) or []
    if not layers:
        return "the model has no layers"
    if any(t != "full_attention" for t in getattr(inner, "layer_types", None) or []):
        return "the model has sliding-window layers"
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not fusable([attn.q_proj, attn.k_proj, attn.v_proj]) or not fusable([mlp.gate_proj, mlp.up_proj]):
            return "its projections are not plain or quantized linear layers (adapters or shards)"
    return None


class DenseDecoder:
    def __init__(self, model: Any, attention: str = "auto") -> None:
        """`attention`: "kernel" (engine/text/compiled_step/attention.py, CUDA only), "masked"
        (MLX's attention with a mask of each row's span), or "auto": the kernel where it runs."""
        import mlx.core as mx
        from mlx_lm.models.activations import swiglu

        self.model = model
        self.family = _family(model)
        self.inner = model.model
        self.layers = list(self.inner.layers)
        attn = self.layers[0].self_attn
        self.heads, self.kv_heads = attn.n_heads, attn.n_kv_heads
        self.qkv: list[Fused] = []
        self.gate_up: list[Fused] = []
        self.out: list[Any] = []
        self.down: list[Any] = []
        for layer in self.layers:  # one layer at a time: the peak is one layer's copy
            a, m = layer.self_attn, layer.mlp
            self.qkv.append(fuse([a.q_proj, a.k_proj, a.v_proj]))
            self.gate_up.append(fuse([m.gate_proj, m.up_proj]))
            self.out.append(projection(a.o_proj))
            self.down.append(projection(m.down_proj))
        self.head_dim = self.qkv[0].sizes[0] // self.heads
        self.kernel = attention == "kernel" or (attention == "auto" and kernel_available(self.head_dim))
        if self.kernel and attention == "auto":
            problem = kernel_agrees(self.heads, self.kv_heads, self.head_dim, self.inner.norm.weight.dtype)
            if problem is not None:
                log.warning("the span-attention kernel is not used (MLX's masked attention is): %s", problem)
                self.kernel = False
        self.scale = mx.array([attn.scale], dtype=mx.float32)
        self.swiglu = getattr(sys.modules[type(self.layers[0].mlp).__module__], "swiglu", swiglu)
        tied = getattr(getattr(model, "args", None), "tie_word_embeddings", False) or not hasattr(model, "lm_head")
        self.head = projection(self.inner.embed_tokens if tied else model.lm_head)
        self.step = mx.compile(self._step)

    def _step(self, tokens: Any, starts: Any, ends: Any, keys: list[Any], values: list[Any]
              ) -> tuple[Any, list[Any], list[Any]]:
        """Logits [slots, vocab] for `tokens` [slots] fed at positions `ends`, and the storage with
        their keys and values written."""
        import mlx.core as mx

        slots, heads, kv_heads, dim = keys[0].shape[0], self.heads, self.kv_heads, self.head_dim
        positions = ends - starts
        where = mx.broadcast_to(ends[:, None, None, None], (slots, kv_heads, 1, dim))
        h = self.inner.embed_tokens(tokens)  # [slots, hidden]: one token a row, no length axis to carry
        new_keys, new_values = [], []
        for layer, qkv, gate_up, out_proj, down_proj, k_store, v_store in zip(
                self.layers, self.qkv, self.gate_up, self.out, self.down, keys, values, strict=True):
            attn = layer.self_attn
            q, k, v = qkv.split(qkv(layer.input_layernorm(h)))
            # [slots, heads, 1, dim] is [slots, 1, heads, dim] in memory: one token needs no transpose.
            q = q.reshape(slots, heads, 1, dim)
            k = k.reshape(slots, kv_heads, 1, dim)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q = attn.rope(q, offset=positions)
            k = attn.rope(k, offset=positions)
            v = v.reshape(slots, kv_heads, 1, dim)
            k_store = mx.put_along_axis(k_store, where, k.astype(k_store.dtype), axis=2)
            v_store = mx.put_along_axis(v_store, where, v.astype(v_store.dtype), axis=2)
            new_keys.append(k_store)
            new_values.append(v_store)
            if self.kernel:
                out = span_attention(q, k_store, v_store, starts, ends, self.scale)
            else:
                out = masked_attention(q, k_store, v_store, starts, ends, attn.scale)
            h = h + out_proj(out.reshape(slots, heads * dim))
            gate, up = gate_up.split(gate_up(layer.post_attention_layernorm(h)))
            h = h + down_proj(self.swiglu(gate, up))
        return self.head(self.inner.norm(h)), new_keys, new_values
