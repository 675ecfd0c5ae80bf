"""A batch's attention key/value cache in which every row ends where it ends.

mlx-lm's `BatchKVCache` keeps all rows right-aligned at one write position, so every row must
advance by the same number of tokens per pass. A speculative step writes 1 + k positions for every
row and then keeps, per row, only the tokens its verification accepted; here each row has its own
end: a pass writes each row's new keys at that row's end, and `trim_rows` cuts each row back by its
own count. Positions past a row's end hold stale values that the mask never lets a query see, and
the next pass overwrites them.

Rows keep mlx-lm's conventions otherwise: `left_padding` empty slots before a row's first token,
`offset` each row's next position (what the rotary embedding reads), and the same `filter`,
`extend` and `extract` the batch generator calls when rows leave and join.

Quantized caches (--kv-bits, engine/text/kv_cache.py) keep their keys and values as tuples of packed
values, scales and biases, each indexed like a plain array: a pass quantizes what it writes, and the
row cache carries `bits` and `group_size`, which send mlx-lm's attention to its quantized path.

A sliding-window layer (mlx-lm's `BatchRotatingKVCache`) becomes a row cache with a `window`: its
mask lets a query see only the last `window` positions, and slots that no row's next query can
see any more are dropped from the front a `STEP` at a time, so the layer still holds about a
window of keys. Its `left_padding` goes negative once a row's first tokens are dropped.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

STEP = 256  # slots added at a time when a pass would write past the buffer
Store = Any  # an array, or a quantized cache's tuple of them (packed values, scales, biases)


def _each(f: Any, x: Store) -> Store:
    """`f` applied to an array, or to each array of a quantized tuple."""
    return tuple(f(a) for a in x) if isinstance(x, tuple) else f(x)


def _pairs(f: Any, x: Store, y: Store) -> Store:
    return tuple(f(a, b) for a, b in zip(x, y, strict=True)) if isinstance(x, tuple) else f(x, y)


def _parts(x: Store) -> tuple[mx.array, ...]:
    return x if isinstance(x, tuple) else (x,)


def _first(x: Store) -> mx.array:
    return _parts(x)[0]


class RowKVCache:
    def __init__(self, keys: Store | None, values: Store | None, left_padding: list[int],
                 ends: list[int], window: int | None = None, quant: tuple[int, int] | None = None) -> None:
        self.keys, self.values = keys, values
        if quant is not None:  # (group size, bits): mlx-lm's attention reads `bits` to take its quantized path
            self.group_size, self.bits = quant
        self.left = list(left_padding)
        self.ends = list(ends)
        self.window = window
        self._sync()

    @classmethod
    def of(cls, batch: Any) -> RowKVCache:
        """mlx-lm's batch cache of a layer (every row ending at its write index) as a row cache."""
        from mlx_lm.models.cache import BatchRotatingKVCache

        rows = int(batch.offset.shape[0])
        if hasattr(batch, "bits"):
            return cls(batch.keys, batch.values, batch.left_padding.tolist(), [batch._idx] * rows,
                       quant=(batch.group_size, batch.bits))
        if not isinstance(batch, BatchRotatingKVCache):
            return cls(batch.keys, batch.values, batch.left_padding.tolist(), [batch._idx] * rows)
        batch._temporal_order()  # slots 0 .. _idx in the order the tokens came
        end = min(batch._idx, batch.keys.shape[2]) if batch.keys is not None else 0
        # A row's slot s holds position offset - (end - s): its first slot is end - offset (below 0
        # once the row's first tokens rotated out).
        return cls(batch.keys[..., :end, :] if batch.keys is not None else None,
                   batch.values[..., :end, :] if batch.values is not None else None,
                   [end - o for o in batch.offset.tolist()], [end] * rows, window=batch.max_size)

    def _sync(self) -> None:
        self.left_padding = mx.array(self.left, dtype=mx.int32)
        self._ends = mx.array(self.ends, dtype=mx.int32)
        self.offset = self._ends - self.left_padding  # each row's next position

    # -- a forward pass --------------------------------------------------------------------------

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> mx.array:
        """[rows, 1, N, slots]: query j of row r (at slot end_r + j) sees slots left_r .. end_r + j
        (and, in a window, none more than `window` - 1 before its own)."""
        window_size = window_size or self.window
        slots = mx.arange(max(self.ends) + N)[None, None]
        queries = (self._ends[:, None] + mx.arange(N)[None])[..., None]
        mask = (slots <= queries) & (slots >= self.left_padding[:, None, None])
        if window_size is not None:
            mask = mask & (slots > queries - window_size)
        return mask[:, None]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Store, Store]:
        rows, heads, n, _ = keys.shape
        if hasattr(self, "bits"):
            keys, values = (tuple(mx.quantize(x, group_size=self.group_size, bits=self.bits)) for x in (keys, values))
        top = max(self.ends) + n
        if self.keys is None or top > _first(self.keys).shape[2]:
            self._grow(keys, values, top)
        start = self.ends[0]
        if all(e == start for e in self.ends):  # rows in step: one slice write
            for held, new in ((self.keys, keys), (self.values, values)):
                for part, value in zip(_parts(held), _parts(new), strict=True):
                    part[..., start:start + n, :] = value
        else:
            where = (self._ends[:, None] + mx.arange(n)[None]).reshape(rows, 1, n, 1)
            self.keys = _pairs(lambda a, b: mx.put_along_axis(a, where, b, axis=2), self.keys, keys)
            self.values = _pairs(lambda a, b: mx.put_along_axis(a, where, b, axis=2), self.values, values)
        self.ends = [e + n for e in self.ends]
        self._sync()
        fetched = _each(lambda a: a[..., :top, :], self.keys), _each(lambda a: a[..., :top, :], self.values)
        if self.window is not None:  # after this pass: the next one's mask is made from the new slots
            self._drop_front(n)
        return fetched

    def _grow(self, keys: Store, values: Store, top: int) -> None:
        """Room for `top` slots (a multiple of STEP), shaped like the new `keys` and `values`."""
        size = -(-top // STEP) * STEP

        def zeros(like: mx.array, slots: int) -> mx.array:
            return mx.zeros((like.shape[0], like.shape[1], slots, like.shape[3]), like.dtype)

        if self.keys is None:
            self.keys, self.values = _each(lambda a: zeros(a, size), keys), _each(lambda a: zeros(a, size), values)
            return
        extra = size - _first(self.keys).shape[2]

        def grown(held: mx.array) -> mx.array:
            return mx.concatenate([held, zeros(held, extra)], axis=2)

        self.keys, self.values = _each(grown, self.keys), _each(grown, self.values)

    def _drop_front(self, written: int) -> None:
        """Slots before every row's window: no later query sees them, even once a verification has
        cut the `written` positions just written back to one."""
        drop = min(self.ends) - written - self.window
        if self.keys is None or drop < STEP:
            return
        self.keys, self.values = (_each(lambda a: a[..., drop:, :], x) for x in (self.keys, self.values))
        self.left = [p - drop for p in self.left]
        self.ends = [e - drop for e in self.ends]
        self._sync()

    def trim_rows(self, counts: list[int]) -> None:
        """Cut each row back by its own count: the positions its verification rejected."""
        if any(counts):
            self.ends = [e - c for e, c in zip(self.ends, counts, strict=True)]
            self._sync()

    # -- rows leaving and joining ------------------------------------------------------------------

    def filter(self, keep: list[int]) -> None:
        self.left = [self.left[i] for i in keep]
        self.ends = [self.ends[i] for i in keep]
        if self.keys is not None:
            index = mx.array(keep, dtype=mx.int32)
            self.keys, self.values = (_each(lambda a: a[index], x) for x in (self.keys, self.values))
            drop = max(0, min(self.left)) if self.left else 0
            if drop > 0:  # slots no remaining row uses
                self.keys, self.values = (_each(lambda a: a[..., drop:, :], x) for x in (self.keys, self.values))
                self.left = [p - drop for p in self.left]
                self.ends = [e - drop for e in self.ends]
        self._sync()

    def extend(self, other: RowKVCache) -> None:
        def join(a: mx.array, b: mx.array) -> mx.array:
            return mx.concatenate([a, b])

        if other.keys is None or self.keys is None:
            base = self if self.keys is not None else other
            if base.keys is not None:  # rows with no keys yet get empty buffers of the same width
                empty = other if base is self else self

                def blank(a: mx.array) -> mx.array:
                    return mx.zeros((len(empty.ends), *a.shape[1:]), a.dtype)

                padded = (_each(blank, base.keys), _each(blank, base.values))
                pairs = [(self.keys, self.values), (other.keys, other.values)]
                pairs[0 if base is other else 1] = padded
                self.keys = _pairs(join, pairs[0][0], pairs[1][0])
                self.values = _pairs(join, pairs[0][1], pairs[1][1])
        else:
            size = max(_first(self.keys).shape[2], _first(other.keys).shape[2])

            def wide(a: mx.array) -> mx.array:
                return a if a.shape[2] == size else mx.pad(a, [(0, 0), (0, 0), (0, size - a.shape[2]), (0, 0)])

            self.keys = _pairs(lambda a, b: join(wide(a), wide(b)), self.keys, other.keys)
            self.values = _pairs(lambda a, b: join(wide(a), wide(b)), self.values, other.values)
        self.left += other.left
        self.ends += other.ends
        self._sync()

    def extract(self, idx: int) -> Any:
        """Row `idx` as a single-row cache holding exactly its tokens (its window's, for a window)."""
        from mlx_lm.models.cache import KVCache, RotatingKVCache

        lo, hi = self.left[idx], self.ends[idx]
        if hasattr(self, "bits"):
            from swama.engine.text.kv_cache import QuantizedRow

            cache = QuantizedRow(self.group_size, self.bits)
        else:
            cache = KVCache() if self.window is None else RotatingKVCache(self.window)
        if self.window is not None:
            lo = max(lo, hi - self.window)
        cache.keys = _each(lambda a: mx.contiguous(a[idx:idx + 1, :, lo:hi]), self.keys)
        cache.values = _each(lambda a: mx.contiguous(a[idx:idx + 1, :, lo:hi]), self.values)
        cache.offset = hi - self.left[idx]
        if self.window is not None:
            cache._idx = hi - lo
        return cache

    # -- what mlx-lm reads of a cache --------------------------------------------------------------

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding

    def is_trimmable(self) -> bool:
        return True

    def size(self) -> int:
        return max(self.ends) if self.ends else 0

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(a.nbytes for x in (self.keys, self.values) for a in _parts(x))
