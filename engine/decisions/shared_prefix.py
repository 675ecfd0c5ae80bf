"""Suffixes attending their shared prefix in place: a batched scoring pass without a copy of the
prefix per row.

A decision request's questions share a long prefix (the chat header and the input) and differ in
short suffixes. A batched pass used to give every row its own copy of the prefix's keys and values
and attend each row to it separately: many small products a layer, the prefix's scores masked, and
the copy itself. Here each layer's cache is a `SharedPrefix`: the prefix's keys and values are held
once per request (`[1, kv_heads, prefix, dim]`) for the consecutive rows that continue it, and
`attention` computes the suffixes' attention in two parts merged by one softmax:

- every suffix query of the request's rows against the prefix, as one product per key/value head
  (the prefix read once, nothing to mask: every suffix token sees all of its prefix);
- each row's queries against its own suffix's keys, causal (right padding stays out of sight).

The math is softmax attention over the concatenated keys, computed in float32; RoPE puts each row's
first suffix token at its prefix's length, as a cache of that length would. It is the CPU's path
(decide.py's `DecisionState.in_place`): there it saves the copies and runs the prefix's scores as
large products, spread over the cores; a GPU keeps MLX's fused attention over copies until the two
are measured there. `install` puts
`attention` in front of the model module's `scaled_dot_product_attention` (mlx-lm's, or the CPU
path's of text/cpu_forward.py); every other cache goes to the function it replaced.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Segment:
    """Rows `start .. stop - 1` continue one prefix: its keys and values, [1, kv_heads, prefix, dim]."""

    start: int
    stop: int
    keys: Any
    values: Any


class SharedPrefix:
    """One layer's cache for a batched pass of suffixes, the prefixes held once per segment of rows."""

    def __init__(self, segments: list[Segment], offset: Any) -> None:
        """`offset`: RoPE's, each row's prefix length (one number when every row's is the same)."""
        self.segments = segments
        self.offset = offset
        self.attended = False  # set by `attention`: a model that never calls it cannot use this cache

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        return keys, values  # the rows' own suffix keys and values: this pass keeps nothing

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
        return "causal"  # among each row's own suffix tokens; the prefix needs none

    @property
    def state(self) -> list[Any]:
        return [a for s in self.segments for a in (s.keys, s.values)]


def attended(caches: list[SharedPrefix]) -> bool:
    """Whether every layer of a pass just built went through `attention` (a model whose attention
    does not call its module's `scaled_dot_product_attention` would have read no prefix at all)."""
    return all(c.attended for c in caches)


def layer_caches(prefixes: list[tuple[list[Any], int]]) -> list[SharedPrefix]:
    """A pass's caches, one per layer: `prefixes` holds, per segment in row order, the prefix's caches
    (mlx-lm `KVCache`s of one row, one per layer) and how many rows continue it."""
    import mlx.core as mx

    lengths = [shared[0].offset for shared, rows in prefixes for _ in range(rows)]
    offset: Any = lengths[0] if len(set(lengths)) == 1 else mx.array(lengths)  # one for every layer
    caches = []
    for layer in range(len(prefixes[0][0])):
        segments, start = [], 0
        for shared, rows in prefixes:
            keys, values = shared[layer].keys_and_values()
            segments.append(Segment(start, start + rows, keys, values))
            start += rows
        caches.append(SharedPrefix(segments, offset))
    return caches


def _exp(x: Any) -> Any:
    import mlx.core as mx

    # MLX's CPU `exp` is slow on x86 Linux; `power` is not (text/cpu_forward.py).
    return mx.power(2.0, x * LOG2E) if mx.default_device() == mx.cpu else mx.exp(x)


def attention(queries: Any, keys: Any, values: Any, cache: SharedPrefix, scale: float) -> Any:
    """queries [rows, heads, n, dim] over each row's prefix and its own `keys`/`values`
    [rows, kv_heads, n, dim] (causal). On the CPU the rows are spread over one stream per core (MLX
    runs a stream's elementwise work on one thread), as text/cpu_forward.py spreads a prefill."""
    import mlx.core as mx

    from swama.engine.text.cpu_forward import cpu_streams

    rows = queries.shape[0]
    if mx.default_device() != mx.cpu or rows < 2:
        return _rows(queries, keys, values, cache.segments, scale)
    streams = cpu_streams()
    size = -(-rows // len(streams))
    parts = []
    for n, r0 in enumerate(range(0, rows, size)):
        r1 = min(rows, r0 + size)
        segments = [Segment(max(s.start, r0) - r0, min(s.stop, r1) - r0, s.keys, s.values)
                    for s in cache.segments if s.start < r1 and s.stop > r0]
        with mx.stream(streams[n % len(streams)]):
            parts.append(_rows(queries[r0:r1], keys[r0:r1], values[r0:r1], segments, scale))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)


def _rows(queries: Any, keys: Any, values: Any, segments: list[Segment], scale: float) -> Any:
    import mlx.core as mx

    rows, heads, n, dim = queries.shape
    kv_heads = keys.shape[1]
    repeats = heads // kv_heads
    q = (queries.astype(mx.float32) * scale).reshape(rows, kv_heads, repeats * n, dim)
    # Each row with its own suffix: causal.
    local = (q @ keys.astype(mx.float32).swapaxes(-1, -2)).reshape(rows, kv_heads, repeats, n, n)
    keep = mx.arange(n)[:, None] >= mx.arange(n)[None]
    local = mx.where(keep, local, -mx.inf)
    # Each segment's rows against their prefix: one product per key/value head.
    tops, parts = [], []
    for s in segments:
        count = s.stop - s.start
        qs = q[s.start:s.stop].transpose(1, 0, 2, 3).reshape(kv_heads, count * repeats * n, dim)
        scores = qs @ s.keys[0].astype(mx.float32).swapaxes(-1, -2)  # [kv_heads, count * repeats * n, prefix]
        parts.append(scores)
        tops.append(mx.max(scores, axis=-1).reshape(kv_heads, count, repeats, n).transpose(1, 0, 2, 3))
    top = mx.maximum(mx.concatenate(tops, axis=0), mx.max(local, axis=-1))[..., None]  # [rows, kv_heads, repeats, n, 1]
    local_weights = _exp(local - top)
    total = mx.sum(local_weights, axis=-1, keepdims=True)
    out = local_weights.reshape(rows, kv_heads, repeats * n, n) @ values.astype(mx.float32)
    prefix_out, prefix_total = [], []
    for s, scores in zip(segments, parts, strict=True):
        count = s.stop - s.start
        shift = top[s.start:s.stop].transpose(1, 0, 2, 3, 4).reshape(kv_heads, count * repeats * n, 1)
        weights = _exp(scores - shift)
        prefix_total.append(mx.sum(weights, axis=-1).reshape(kv_heads, count, repeats, n).transpose(1, 0, 2, 3))
        part = weights @ s.values[0].astype(mx.float32)  # [kv_heads, count * repeats * n, dim]
        prefix_out.append(part.reshape(kv_heads, count, repeats * n, dim).transpose(1, 0, 2, 3))
    out = out + mx.concatenate(prefix_out, axis=0)
    total = total + mx.concatenate(prefix_total, axis=0)[..., None]
    out = out.reshape(rows, kv_heads, repeats, n, dim) / total
    return out.reshape(rows, heads, n, dim).astype(queries.dtype)


def install(model: Any) -> None:
    """`attention` for `SharedPrefix` caches in the module that defines `model`'s class; every other
    cache goes to the function it replaces. Once per module."""
    module = sys.modules.get(type(model).__module__)
    current = getattr(module, "scaled_dot_product_attention", None)
    if current is None or getattr(current, "shared_prefix", False):
        return

    def dispatch(queries: Any, keys: Any, values: Any, cache: Any, scale: float, mask: Any,
                 sinks: Any = None) -> Any:
        if isinstance(cache, SharedPrefix) and sinks is None:
            cache.attended = True
            return attention(queries, keys, values, cache, scale)
        return current(queries, keys, values, cache, scale, mask, sinks)

    dispatch.shared_prefix = True  # type: ignore[attr-defined]
    module.scaled_dot_product_attention = dispatch  # type: ignore[union-attr]
