"""A faster forward pass for language models on the CPU: attention and SwiGLU without MLX's `exp`.

MLX's CPU `exp` is slow on x86 Linux (about 60 M values/s on a 2-core machine, where numpy manages
over 400 M), while its `power` runs 2-3x faster, and a prefill spends most of its time in the two
places that exponentiate: the attention softmax (5 of the 8 s of a 1,052-token SmolLM2 forward) and
the SiLU of the gated MLP. On the CPU this module replaces both, with the same math:

- `e^x` is computed as `2^(x·log2 e)` with `mx.power`;
- **attention** is block-causal: under a causal mask the queries go in blocks of `BLOCK`, and
  each block attends only to the keys up to its own last position, so the masked upper triangle
  is never computed or exponentiated (about half of a prompt's scores); the softmax's division is
  taken after the product with the values (on `queries x dim` values instead of `queries x keys`);
- the blocks, or a batch's rows, are spread over one CPU stream per core: MLX runs each stream on
  its own thread, and the parts are joined on the caller's stream.

Results match MLX's own kernels to float32 rounding (tests/engine/test_cpu_forward.py). `install`
swaps these functions into the model's mlx-lm module; attention sinks and small problems (a decode
step, where MLX's fused kernels win) keep mlx-lm's path, and so does a quantized cache's decode step
(a prompt's chunk reads the same keys and values dequantized).
"""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any

BLOCK = 64  # query rows per block: smaller skips more of the masked half, at more dispatch
MIN_SCORES = 1 << 16  # below this many scores (batch x heads x queries x keys) MLX's kernel is as fast
MIN_QUERIES = 8  # fewer queries a row (a decode step) stay on MLX's fused kernel, which is faster there
MIN_ELEMENTS = 1 << 16  # a smaller SwiGLU stays on mlx-lm's compiled one (one kernel beats five small ones)
LOG2E = 1.0 / math.log(2.0)
_local = threading.local()


def cpu_streams() -> list[Any]:
    """One CPU stream per core, at most 8, made once per thread (MLX streams belong to the thread
    that made them; the threads that run models are parked, never ended)."""
    import mlx.core as mx

    streams = getattr(_local, "streams", None)
    if streams is None:
        streams = _local.streams = [mx.new_stream(mx.cpu) for _ in range(max(1, min(8, os.cpu_count() or 1)))]
    return streams


def swiglu(gate: Any, x: Any) -> Any:
    """`silu(gate) * x`, its sigmoid through `power` (a prompt's); a decode step's through mlx-lm."""
    import mlx.core as mx
    from mlx_lm.models.activations import swiglu as compiled

    if gate.size < MIN_ELEMENTS:
        return compiled(gate, x)
    return gate / (1.0 + mx.power(2.0, gate * -LOG2E)) * x


def _attend(queries: Any, keys: Any, values: Any, scale: float, mask: Any, offset: int) -> Any:
    """Softmax attention of `queries` [b, heads, n, d] over `keys`/`values` [b, kv_heads, m, d].
    `mask`: None, an array (boolean keep-mask or additive), or "causal" with the queries at
    positions `offset` .. `offset + n - 1` of the keys."""
    import mlx.core as mx

    b, heads, n, d = queries.shape
    kv_heads, m = keys.shape[1], keys.shape[2]
    repeats = heads // kv_heads
    # Grouped queries share their key/value head: [b, kv_heads, repeats * n, d] against [b, kv_heads, m, d].
    q = (queries * scale).reshape(b, kv_heads, repeats * n, d)
    scores = (q @ keys.swapaxes(-1, -2)).reshape(b, kv_heads, repeats, n, m)
    if isinstance(mask, str):
        keep = mx.arange(offset, offset + n)[:, None] >= mx.arange(m)[None]
        scores = mx.where(keep, scores, mx.finfo(scores.dtype).min)
    elif mask is not None:
        if mask.ndim == 4:  # [b or 1, heads or 1, n or 1, m]: the heads split into kv_heads x repeats
            mask = mask.reshape(mask.shape[0], -1, repeats if mask.shape[1] > 1 else 1, *mask.shape[2:])
        scores = mx.where(mask, scores, mx.finfo(scores.dtype).min) if mask.dtype == mx.bool_ else scores + mask
    top = mx.max(scores, axis=-1, keepdims=True)
    weights = mx.power(2.0, (scores - top) * LOG2E)
    total = mx.sum(weights, axis=-1, keepdims=True)
    out = (weights.reshape(b, kv_heads, repeats * n, m) @ values).reshape(b, kv_heads, repeats, n, d)
    return (out / total).reshape(b, heads, n, d).astype(queries.dtype)


def _row_groups(batch: int, parts: int) -> list[tuple[int, int]]:
    size = -(-batch // parts)
    return [(r, min(batch, r + size)) for r in range(0, batch, size)]


def attention(queries: Any, keys: Any, values: Any, cache: Any, scale: float, mask: Any,
              sinks: Any = None) -> Any:
    """mlx-lm's `scaled_dot_product_attention`, by blocks and streams on the CPU where that pays."""
    import mlx.core as mx
    from mlx_lm.models.base import scaled_dot_product_attention as whole

    batch, heads, length, _ = queries.shape
    known_mask = mask is None or isinstance(mask, mx.array) or (isinstance(mask, str) and mask == "causal")
    if hasattr(cache, "bits"):  # quantized keys and values (packed, scales, biases), --kv-bits
        if length < MIN_QUERIES or sinks is not None:  # a decode step: mlx-lm's quantized kernels
            return whole(queries, keys, values, cache, scale, mask, sinks)
        # A prompt's chunk: the same values dequantized, through the blocks below (mlx-lm's quantized
        # path exponentiates every score with MLX's slow exp: 4x slower prefill).
        keys = mx.dequantize(*keys, group_size=cache.group_size, bits=cache.bits)
        values = mx.dequantize(*values, group_size=cache.group_size, bits=cache.bits)
        cache = None
    keys_length = keys.shape[2]
    if (sinks is not None or not known_mask or length < MIN_QUERIES
            or batch * heads * length * keys_length < MIN_SCORES):
        return whole(queries, keys, values, cache, scale, mask, sinks)
    streams = cpu_streams()
    causal = isinstance(mask, str)
    if isinstance(mask, mx.array) and mask.ndim < 4:  # broadcast as MLX does: [..., queries, keys] at the end
        mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    offset = keys_length - length  # a causal mask puts the queries at the last positions
    blocks = [(i, min(length, i + BLOCK)) for i in range(0, length, BLOCK)] if length >= 2 * BLOCK else [(0, length)]
    rows = _row_groups(batch, len(streams)) if len(blocks) < len(streams) else [(0, batch)]
    groups, n = [], 0
    for r0, r1 in rows:
        parts = []
        for q0, q1 in blocks:
            end = offset + q1 if causal else keys_length  # a causal block sees no key after its last query
            part_mask = mask
            if isinstance(mask, mx.array):
                part_mask = mask[r0:r1] if mask.shape[0] > 1 else mask
                part_mask = part_mask[..., q0:q1, :] if part_mask.shape[-2] > 1 else part_mask
            with mx.stream(streams[n % len(streams)]):
                parts.append(_attend(queries[r0:r1, :, q0:q1], keys[r0:r1, :, :end], values[r0:r1, :, :end],
                                     scale, part_mask, offset + q0))
            n += 1
        groups.append(parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2))
    return groups[0] if len(groups) == 1 else mx.concatenate(groups, axis=0)


def install(model: Any) -> bool:
    """Use `attention` and `swiglu` in the mlx-lm module that defines `model`'s class, in place of
    mlx-lm's own functions; returns whether the attention was replaced. The module serves every
    model of that architecture in the process, which runs on one device."""
    from mlx_lm.models import activations, base

    module = sys.modules.get(type(model).__module__)
    if module is None or not module.__name__.startswith("mlx_lm.models."):
        return False
    if getattr(module, "swiglu", None) is activations.swiglu:
        module.swiglu = swiglu
    current = getattr(module, "scaled_dot_product_attention", None)
    if current is base.scaled_dot_product_attention:
        module.scaled_dot_product_attention = current = attention
    return current is attention
