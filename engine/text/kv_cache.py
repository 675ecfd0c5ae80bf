"""The quantized key/value caches themselves (engine/text/kv_quant.py decides where they are used):
`QuantizedRow`, one prompt's (mlx-lm's `QuantizedKVCache`, which merges into a batch), and
`BatchQuantizedKVCache`, mlx-lm's `BatchKVCache` over packed values, scales and biases. Importing
this module imports mlx-lm."""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import BatchKVCache, QuantizedKVCache, dynamic_roll

from swama.engine.text.kv_policy import KVQuant, quantized


def _quantize(x: Any, kv: KVQuant) -> tuple[Any, Any, Any]:
    import mlx.core as mx

    return tuple(mx.quantize(x, group_size=kv.group_size, bits=kv.bits))


def _slice(parts: tuple[Any, ...], *index: Any) -> tuple[Any, ...]:
    return tuple(p[index] for p in parts)


class QuantizedRow(QuantizedKVCache):
    """One prompt's quantized cache (mlx-lm's), which merges into a `BatchQuantizedKVCache`."""

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        return BatchQuantizedKVCache.merge(caches)

    @classmethod
    def of(cls, cache: Any, kv: KVQuant | None = None) -> QuantizedRow:
        """`cache` as a row: a plain KVCache quantized with `kv`, an mlx-lm QuantizedKVCache as it is."""
        if isinstance(cache, QuantizedRow):
            return cache
        if isinstance(cache, QuantizedKVCache):
            row = cls(cache.group_size, cache.bits)
            row.keys, row.values, row.offset = cache.keys, cache.values, cache.offset
            return row
        assert kv is not None
        row = cls(kv.group_size, kv.bits)
        row.offset = cache.offset
        if cache.keys is not None and cache.offset > 0:
            row.keys, row.values = (_quantize(x[..., :cache.offset, :], kv) for x in (cache.keys, cache.values))
        return row

    def prefix(self, n: int) -> QuantizedRow:
        """A new row holding the first `n` positions (sliced arrays: writes to one never reach the other)."""
        row = QuantizedRow(self.group_size, self.bits)
        row.offset = n
        row.keys = _slice(self.keys, Ellipsis, slice(0, n), slice(None))
        row.values = _slice(self.values, Ellipsis, slice(0, n), slice(None))
        return row


class BatchQuantizedKVCache(BatchKVCache):
    """mlx-lm's `BatchKVCache` (rows left-padded to one write position) over quantized keys and values."""

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8) -> None:
        super().__init__(left_padding)
        self.group_size, self.bits = group_size, bits

    @property
    def kv(self) -> KVQuant:
        return KVQuant(self.bits, self.group_size)

    @classmethod
    def of(cls, cache: BatchKVCache, kv: KVQuant) -> BatchQuantizedKVCache:
        """A plain batch cache quantized: the same rows, padding and positions."""
        out = cls([0], kv.group_size, kv.bits)
        out.left_padding, out.offset, out._idx = cache.left_padding, cache.offset, cache._idx
        if cache.keys is not None and cache._idx > 0:
            out.keys = _quantize(cache.keys[..., :cache._idx, :], kv)
            out.values = _quantize(cache.values[..., :cache._idx, :], kv)
        return out

    def _empty(self, rows: int, heads: int, length: int, dim: int, dtype: Any) -> tuple[Any, Any, Any]:
        import mlx.core as mx

        packed = dim * self.bits // 32
        groups = dim // self.group_size
        return (mx.zeros((rows, heads, length, packed), mx.uint32), mx.zeros((rows, heads, length, groups), dtype),
                mx.zeros((rows, heads, length, groups), dtype))

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Any, Any]:
        import mlx.core as mx

        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            rows, heads, _, dk = keys.shape
            grow = (self.step + n - 1) // self.step * self.step
            new_k = self._empty(rows, heads, grow, dk, keys.dtype)
            new_v = self._empty(rows, heads, grow, values.shape[3], values.dtype)
            if self.keys is not None:
                if prev % self.step:
                    self.keys = _slice(self.keys, Ellipsis, slice(0, prev), slice(None))
                    self.values = _slice(self.values, Ellipsis, slice(0, prev), slice(None))
                self.keys = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.keys, new_k, strict=True))
                self.values = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.values, new_v, strict=True))
            else:
                self.keys, self.values = new_k, new_v
        self.offset = self.offset + n
        self._idx += n
        for held, new in ((self.keys, _quantize(keys, self.kv)), (self.values, _quantize(values, self.kv))):
            for part, value in zip(held, new, strict=True):
                part[..., prev:self._idx, :] = value
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Any, Any]:
        cut = (Ellipsis, slice(0, self._idx), slice(None))
        return _slice(self.keys, *cut), _slice(self.values, *cut)

    def finalize(self) -> None:
        if self._right_padding is not None:
            padding = self._right_padding[:, None]
            self.keys = tuple(dynamic_roll(x, padding, axis=2) for x in self.keys)
            self.values = tuple(dynamic_roll(x, padding, axis=2) for x in self.values)
            self.offset = self.offset - self._right_padding
            self.left_padding += self._right_padding
            self._right_padding = None

    def filter(self, batch_indices: Any) -> None:
        if self.keys is not None:
            self.keys = _slice(self.keys, batch_indices)
            self.values = _slice(self.values, batch_indices)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shift = min(self.left_padding.tolist())
        if shift > 0:
            if self.keys is not None:
                self.keys = _slice(self.keys, Ellipsis, slice(shift, None), slice(None))
                self.values = _slice(self.values, Ellipsis, slice(shift, None), slice(None))
            self._idx -= shift
            self.left_padding -= shift

    def extend(self, other: Any) -> None:
        import mlx.core as mx

        if not quantized(other):
            other = BatchQuantizedKVCache.of(other, self.kv)
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        ref = self if self.keys is not None else other
        rows_heads = ref.keys[0].shape[1]
        widths = [x.shape[3] for x in (*ref.keys, *ref.values)]
        dtypes = [x.dtype for x in (*ref.keys, *ref.values)]
        longest = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)

        def padded(c: BatchQuantizedKVCache) -> tuple[Any, ...]:
            parts = (*c.keys, *c.values) if c.keys is not None else tuple(
                mx.zeros((c.offset.shape[0], rows_heads, 0, w), d) for w, d in zip(widths, dtypes, strict=True))
            left = longest - c._idx
            right = size - parts[0].shape[2] - left
            if right < 0:
                parts = tuple(p[..., :right, :] for p in parts)
                right = 0
            if left or right:
                parts = tuple(mx.pad(p, [(0, 0), (0, 0), (left, right), (0, 0)]) for p in parts)
            return (*parts, c.offset, c.left_padding + left)

        joined = [mx.concatenate(pair) for pair in zip(padded(self), padded(other), strict=True)]
        self.keys, self.values = tuple(joined[:3]), tuple(joined[3:6])
        self.offset, self.left_padding = joined[6], joined[7]
        self._idx = longest

    def extract(self, idx: int) -> QuantizedRow:
        import mlx.core as mx

        padding = self.left_padding.tolist()[idx]
        row = QuantizedRow(self.group_size, self.bits)
        cut = (slice(idx, idx + 1), slice(None), slice(padding, self._idx))
        row.keys = tuple(mx.contiguous(x) for x in _slice(self.keys, *cut))
        row.values = tuple(mx.contiguous(x) for x in _slice(self.values, *cut))
        row.offset = self._idx - padding
        return row

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        """Rows (quantized, or plain ones quantized here like the first quantized row) left-padded into one batch."""
        import mlx.core as mx

        kv = next((KVQuant(c.bits, c.group_size) for c in caches if quantized(c)), None)
        assert kv is not None, "a quantized batch needs a quantized row"
        rows = [QuantizedRow.of(c, kv) for c in caches]
        lengths = [r.offset for r in rows]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        out = cls(padding, kv.group_size, kv.bits)
        filled = [r for r in rows if r.keys is not None and r.offset > 0]
        if longest == 0 or not filled:
            return out
        first = filled[0]

        def stacked(pick: Any) -> tuple[Any, ...]:
            parts = []
            for ref in pick(first):
                shape = (len(rows), ref.shape[1], longest, ref.shape[3])
                parts.append(mx.zeros(shape, ref.dtype))
            for i, (pad, r) in enumerate(zip(padding, rows, strict=True)):
                if r.keys is None or r.offset == 0:
                    continue
                for part, src in zip(parts, pick(r), strict=True):
                    part[i:i + 1, :, pad:pad + r.offset] = src[..., :r.offset, :]
            return tuple(parts)

        out.keys, out.values = stacked(lambda r: r.keys), stacked(lambda r: r.values)
        out.offset = out.offset + longest
        out._idx = longest
        return out

    def size(self) -> int:
        return self._idx

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(x.nbytes for x in (*self.keys, *self.values))
