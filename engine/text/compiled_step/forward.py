"""The traced decode step of the families served most: qwen3, qwen2, llama (full attention) and
qwen3_5 (linear-attention layers with a full-attention layer every few).

Their layers are alike: RMSNorm, a token mixer, RMSNorm, a SwiGLU MLP, each with a residual. The
attention layers project queries, keys and values (qwen3 and qwen3_5 normalize queries and keys per
head; qwen3_5's queries carry a sigmoid gate for the output and its RoPE turns part of each head),
apply RoPE at each row's own position and attend grouped-query heads; qwen3_5's linear layers run one
step of their recurrence (linear.py). `Decoder.step` runs one token for every slot of a `SlotStore`:
each row's new key and value are written at its `end`, and it attends to its positions
`start .. end` (attention.py: one CUDA kernel on NVIDIA GPUs, MLX's masked attention elsewhere); a
recurrent layer's state is read and replaced whole. The function is traced by `mx.compile` once per
(slots, capacity) shape; the weights are captured as constants, so a call passes only the tokens,
the lengths and the storage. The model's own modules do the norms, RoPE, the output projections and
the head, so the math is mlx-lm's; only the fused projections and the storage are this package's.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from swama.engine.text.compiled_step import linear
from swama.engine.text.compiled_step.attention import (
    kernel_agrees,
    kernel_available,
    masked_attention,
    span_attention,
)
from swama.engine.text.compiled_step.fusion import Fused, fusable, fuse, projection
from swama.engine.text.compiled_step.slots import SlotStore

FAMILIES = ("qwen3", "qwen2", "llama", "qwen3_5")
log = logging.getLogger("swama.engine")


def _family(model: Any) -> str | None:
    module = type(model).__module__
    name = module.rsplit(".", 1)[-1]
    if not module.startswith("mlx_lm.models.") or name not in FAMILIES:
        return None
    return name


def _text(model: Any) -> Any:
    """The language model inside: qwen3_5's `Model` wraps its text model (and its head)."""
    return getattr(model, "language_model", model)


def _recurrent(layer: Any) -> bool:
    return bool(getattr(layer, "is_linear", False))


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
    if all(_recurrent(layer) for layer in layers):
        return "the model has no attention layer"
    for layer in layers:
        mlp = layer.mlp
        if not hasattr(mlp, "gate_proj"):
            return "its MLP is a mixture of experts"
        if _recurrent(layer):
            mixer_ok = linear.covered(layer.linear_attn)
        else:
            attn = layer.self_attn
            mixer_ok = fusable([attn.q_proj, attn.k_proj, attn.v_proj])
        if not mixer_ok or not fusable([mlp.gate_proj, mlp.up_proj]):
            return "its projections are not plain or quantized linear layers (adapters or shards)"
    return None


class Decoder:
    def __init__(self, model: Any, attention: str = "auto") -> None:
        """`attention`: "kernel" (engine/text/compiled_step/attention.py, CUDA only), "masked"
        (MLX's attention with a mask of each row's span), or "auto": the kernel where it runs."""
        import mlx.core as mx
        from mlx_lm.models.activations import swiglu

        self.model = model
        self.family = _family(model)
        self.inner = model.model
        self.layers = list(self.inner.layers)
        self.mixers: list[Fused | linear.LinearStep] = []  # a layer's fused QKV, or its linear step
        self.gate_up: list[Fused] = []
        self.out: list[Any] = []  # an attention layer's output projection (None for a linear one)
        self.down: list[Any] = []
        for layer in self.layers:  # one layer at a time: the peak is one layer's copy
            m = layer.mlp
            if _recurrent(layer):
                self.mixers.append(linear.LinearStep(layer.linear_attn))
                self.out.append(None)
            else:
                a = layer.self_attn
                self.mixers.append(fuse([a.q_proj, a.k_proj, a.v_proj]))
                self.out.append(projection(a.o_proj))
            self.gate_up.append(fuse([m.gate_proj, m.up_proj]))
            self.down.append(projection(m.down_proj))
        first = next(i for i, layer in enumerate(self.layers) if not _recurrent(layer))
        attn = self.layers[first].self_attn
        self.heads = getattr(attn, "n_heads", None) or attn.num_attention_heads
        self.kv_heads = getattr(attn, "n_kv_heads", None) or attn.num_key_value_heads
        self.head_dim = self.mixers[first].sizes[1] // self.kv_heads  # the key projection's width
        self.gated = self.mixers[first].sizes[0] == 2 * self.heads * self.head_dim  # queries carry a gate
        self.recurrent = {i: mixer.states() for i, mixer in enumerate(self.mixers)
                          if isinstance(mixer, linear.LinearStep)}
        self.kernel = attention == "kernel" or (attention == "auto" and kernel_available(self.head_dim))
        if self.kernel and attention == "auto":
            problem = kernel_agrees(self.heads, self.kv_heads, self.head_dim, self.inner.norm.weight.dtype)
            if problem is not None:
                log.warning("the span-attention kernel is not used (MLX's masked attention is): %s", problem)
                self.kernel = False
        self.scale = mx.array([attn.scale], dtype=mx.float32)
        self.swiglu = getattr(sys.modules[type(self.layers[0].mlp).__module__], "swiglu", swiglu)
        text = _text(model)
        tied = getattr(getattr(text, "args", None), "tie_word_embeddings", False) or not hasattr(text, "lm_head")
        self.head = projection(self.inner.embed_tokens if tied else text.lm_head)
        self.step = mx.compile(self._step)

    def new_store(self, dtype: Any = None) -> SlotStore:
        return SlotStore(len(self.layers), self.kv_heads, self.head_dim, dtype, recurrent=self.recurrent)

    def batch_cache(self, paddings: list[int]) -> list[Any]:
        """Empty mlx-lm batch caches for rows left-padded by `paddings`, one per layer (a prefill
        outside the admission's: benchmarks and tests)."""
        from mlx_lm.models.cache import ArraysCache, BatchKVCache

        return [ArraysCache(len(self.recurrent[i]), left_padding=paddings) if i in self.recurrent
                else BatchKVCache(paddings) for i in range(len(self.layers))]

    def _step(self, tokens: Any, starts: Any, ends: Any, keys: list[Any], values: list[Any], states: list[Any]
              ) -> tuple[Any, list[Any], list[Any], list[Any]]:
        """Logits [slots, vocab] for `tokens` [slots] fed at positions `ends`, and the storage with
        their keys, values and states written."""
        import mlx.core as mx

        slots, kv_heads, dim = tokens.shape[0], self.kv_heads, self.head_dim
        positions = ends - starts
        where = mx.broadcast_to(ends[:, None, None, None], (slots, kv_heads, 1, dim))
        h = self.inner.embed_tokens(tokens)  # [slots, hidden]: one token a row, no length axis to carry
        pairs, rows = iter(zip(keys, values, strict=True)), iter(states)
        new_keys, new_values, new_states = [], [], []
        for layer, mixer, out_proj, gate_up, down_proj in zip(
                self.layers, self.mixers, self.out, self.gate_up, self.down, strict=True):
            x = layer.input_layernorm(h)
            if isinstance(mixer, linear.LinearStep):
                r, window, state = mixer(x, next(rows), next(rows))
                new_states += [window, state]
            else:
                k_store, v_store = next(pairs)
                r, k_store, v_store = self._attend(layer.self_attn, mixer, out_proj, x, positions, starts, ends,
                                                   where, k_store, v_store)
                new_keys.append(k_store)
                new_values.append(v_store)
            h = h + r
            gate, up = gate_up.split(gate_up(layer.post_attention_layernorm(h)))
            h = h + down_proj(self.swiglu(gate, up))
        return self.head(self.inner.norm(h)), new_keys, new_values, new_states

    def _attend(self, attn: Any, qkv: Fused, out_proj: Any, x: Any, positions: Any, starts: Any, ends: Any,
                where: Any, k_store: Any, v_store: Any) -> tuple[Any, Any, Any]:
        """An attention layer's output for one token a row, and its key/value storage with it written."""
        import mlx.core as mx

        slots, heads, kv_heads, dim = x.shape[0], self.heads, self.kv_heads, self.head_dim
        q, k, v = qkv.split(qkv(x))
        gate = None
        if self.gated:  # qwen3_5: each head's queries, then its gate
            q, gate = mx.split(q.reshape(slots, heads, 2 * dim), 2, axis=-1)
            gate = gate.reshape(slots, heads * dim)
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
        if self.kernel:
            out = span_attention(q, k_store, v_store, starts, ends, self.scale)
        else:
            out = masked_attention(q, k_store, v_store, starts, ends, attn.scale)
        out = out.reshape(slots, heads * dim)
        if gate is not None:
            out = out * mx.sigmoid(gate)
        return out_proj(out), k_store, v_store
