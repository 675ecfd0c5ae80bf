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
first suffix token at its prefix's length, as a cache of that length would. On the CPU this saves
the copies and runs the prefix's scores as large products, spread over the cores.

A GPU's pass (`Layout`, `_fused`) keeps MLX's fused attention instead, one call per layer for all
rows: each request becomes one sequence, its prefix followed by its rows' suffixes end to end, and a
mask keeps every row to its prefix and its own suffix. The prefixes are read as slices of the
buffers their pack was prefilled into (packed_prefill.py), one copy per request and layer rather
than one per row, and every shape comes from a small set. `install` puts `attention` in front of
the model module's `scaled_dot_product_attention` (mlx-lm's, or the CPU path's of
text/cpu_forward.py); every other cache goes to the function it replaced.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class Segment:
    """Rows `start .. stop - 1` continue one prefix: its keys and values, [1, kv_heads, prefix, dim];
    `pack`, where the prefix was read in a pack (packed_prefill.py): the pack's key and value buffers
    and the prefix's row in them, so a pass reads many prefixes in one slice."""

    start: int
    stop: int
    keys: Any
    values: Any
    pack: tuple[Any, Any, int] | None = None


GPU_PREFIX_STEP = 128  # on a GPU, prefixes are padded to a multiple of this (a pack's, a fused pass's)


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _slots(count: int) -> int:
    """Rows a segment's sequence holds: a power of two up to 4, else a multiple of 4 (fewer shapes)."""
    return 1 << (count - 1).bit_length() if count <= 4 else round_up(count, 4)


class Layout:
    """What a pass's layers share on a GPU (`_fused`): each segment's rows laid end to end in one
    query sequence of `slots` rows (at least the longest segment's count; shorter ones repeat their
    last row, whose output is dropped), and the mask that keeps every row to its prefix and its own
    suffix. The segments are padded to a power of two (empty prefixes), the prefixes to a multiple of
    `GPU_PREFIX_STEP`: MLX builds a cuDNN graph for every new attention shape, with the device idle, so
    shapes come from a small set. Built at the first layer, when the suffix width and dtype are known."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.groups = 1 << (len(segments) - 1).bit_length()
        self.slots = _slots(max(s.stop - s.start for s in segments))
        self.width = round_up(max(s.keys.shape[2] for s in segments), GPU_PREFIX_STEP)
        self.built: tuple[int, Any] | None = None  # (suffix width, dtype) the arrays below are for
        self.gather: Any = None  # [groups * slots] the row each slot reads
        self.scatter: Any = None  # [rows] the slot each row's output is read from
        self.mask: Any = None  # [groups, 1, slots * n, width + slots * n], additive

    def build(self, n: int, dtype: Any) -> None:
        import mlx.core as mx

        if self.built == (n, dtype):
            return
        slots, segments = self.slots, self.segments
        gather = [s.start + min(j, s.stop - s.start - 1) for s in segments for j in range(slots)]
        self.gather = mx.array(gather + [0] * ((self.groups - len(segments)) * slots))
        self.scatter = mx.array([k * slots + r - s.start for k, s in enumerate(segments) for r in range(s.start, s.stop)])
        at = mx.arange(slots * n)
        own = (at[:, None] // n == at[None] // n) & (at[None] % n <= at[:, None] % n)  # [slots*n, slots*n]
        lengths = mx.array([s.keys.shape[2] for s in segments] + [0] * (self.groups - len(segments)))
        prefix = mx.arange(self.width)[None] < lengths[:, None]  # [groups, width]
        shape = (self.groups, 1, slots * n)
        keep = mx.concatenate([mx.broadcast_to(prefix[:, None, None, :], (*shape, self.width)),
                               mx.broadcast_to(own[None, None], (*shape, slots * n))], axis=-1)
        self.mask = mx.where(keep, mx.array(0.0, dtype), mx.array(-mx.inf, dtype))
        self.built = (n, dtype)

    def prefixes(self, segments: list[Segment], which: int) -> Any:
        """The segments' prefix keys (`which` 0) or values (1), [groups, kv_heads, width, dim]: a
        slice of a pack's buffer for each run of segments that are consecutive rows of one pack,
        padded with zeros (masked) to the width and to the groups."""
        import mlx.core as mx

        blocks: list[Any] = []
        first = 0
        while first < len(segments):
            s = segments[first]
            last = first + 1
            if s.pack is not None:
                while (last < len(segments) and segments[last].pack is not None
                       and segments[last].pack[which] is s.pack[which]
                       and segments[last].pack[2] == s.pack[2] + last - first):
                    last += 1
                block = s.pack[which][s.pack[2]:s.pack[2] + last - first]
            else:
                block = s.keys if which == 0 else s.values
            blocks.append(block[:, :, :self.width])
            first = last
        padded = [b if b.shape[2] == self.width else mx.pad(b, [(0, 0), (0, 0), (0, self.width - b.shape[2]), (0, 0)])
                  for b in blocks]
        out = padded[0] if len(padded) == 1 else mx.concatenate(padded)
        if out.shape[0] < self.groups:
            out = mx.pad(out, [(0, self.groups - out.shape[0]), (0, 0), (0, 0), (0, 0)])
        return out


class SharedPrefix:
    """One layer's cache for a batched pass of suffixes, the prefixes held once per segment of rows."""

    def __init__(self, segments: list[Segment], offset: Any, layout: Layout | None = None) -> None:
        """`offset`: RoPE's, each row's prefix length (one number when every row's is the same);
        `layout`: the pass's, shared by its layers (a GPU's)."""
        self.segments = segments
        self.offset = offset
        self.layout = layout
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


def layer_caches(prefixes: list[tuple[list[Any], int]], fused: bool | None = None) -> list[SharedPrefix]:
    """A pass's caches, one per layer: `prefixes` holds, per segment in row order, the prefix's caches
    (mlx-lm `KVCache`s of one row, one per layer) and how many rows continue it. `fused`: attention
    as one fused call per layer (`_fused`), by default on a GPU."""
    import mlx.core as mx

    if fused is None:
        fused = mx.default_device() != mx.cpu

    lengths = [shared[0].offset for shared, rows in prefixes for _ in range(rows)]
    offset: Any = lengths[0] if len(set(lengths)) == 1 else mx.array(lengths)  # one for every layer
    caches = []
    layout = None
    for layer in range(len(prefixes[0][0])):
        segments, start = [], 0
        for shared, rows in prefixes:
            keys, values = shared[layer].keys_and_values()
            segments.append(Segment(start, start + rows, keys, values, getattr(shared[layer], "pack", None)))
            start += rows
        if layout is None and fused:
            layout = Layout(segments)  # the prefixes' lengths and the rows are every layer's
        caches.append(SharedPrefix(segments, offset, layout))
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
    if cache.layout is not None:
        return _fused(queries, keys, values, cache, scale)
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


def _fused(queries: Any, keys: Any, values: Any, cache: SharedPrefix, scale: float) -> Any:
    """A GPU's pass: one fused attention call for every row. Each segment becomes one sequence: its
    prefix (right-padded to the layout's width) followed by its rows' suffixes end to end, and the
    pass's mask lets each suffix token see its prefix and the tokens of its own suffix up to it."""
    import mlx.core as mx

    layout = cache.layout
    rows, heads, n, dim = queries.shape
    layout.build(n, queries.dtype)
    groups, slots = layout.groups, layout.slots

    def laid_out(x: Any) -> Any:  # [rows, h, n, dim] -> [groups, h, slots * n, dim]
        x = x[layout.gather].reshape(groups, slots, x.shape[1], n, dim)
        return x.transpose(0, 2, 1, 3, 4).reshape(groups, x.shape[2], slots * n, dim)

    k = mx.concatenate([layout.prefixes(cache.segments, 0), laid_out(keys)], axis=2)
    v = mx.concatenate([layout.prefixes(cache.segments, 1), laid_out(values)], axis=2)
    out = mx.fast.scaled_dot_product_attention(laid_out(queries), k, v, scale=scale, mask=layout.mask)
    out = out.reshape(groups, heads, slots, n, dim).transpose(0, 2, 1, 3, 4).reshape(groups * slots, heads, n, dim)
    return out[layout.scatter]


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
