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

A sliding-window layer (mlx-lm's `BatchRotatingKVCache`) becomes a row cache with a `window`: its
mask lets a query see only the last `window` positions, and slots that no row's next query can
see any more are dropped from the front a `STEP` at a time, so the layer still holds about a
window of keys. Its `left_padding` goes negative once a row's first tokens are dropped.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

STEP = 256  # slots added at a time when a pass would write past the buffer


class RowKVCache:
    def __init__(self, keys: mx.array | None, values: mx.array | None, left_padding: list[int],
                 ends: list[int], window: int | None = None) -> None:
        self.keys, self.values = keys, values
        self.left = list(left_padding)
        self.ends = list(ends)
        self.window = window
        self._sync()

    @classmethod
    def of(cls, batch: Any) -> RowKVCache:
        """mlx-lm's batch cache of a layer (every row ending at its write index) as a row cache."""
        from mlx_lm.models.cache import BatchRotatingKVCache

        rows = int(batch.offset.shape[0])
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

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        rows, heads, n, _ = keys.shape
        top = max(self.ends) + n
        if self.keys is None or top > self.keys.shape[2]:
            self._grow(keys, values, top)
        start = self.ends[0]
        if all(e == start for e in self.ends):  # rows in step: one slice write
            self.keys[..., start:start + n, :] = keys
            self.values[..., start:start + n, :] = values
        else:
            where = (self._ends[:, None] + mx.arange(n)[None]).reshape(rows, 1, n, 1)
            self.keys = mx.put_along_axis(self.keys, where, keys, axis=2)
            self.values = mx.put_along_axis(self.values, where, values, axis=2)
        self.ends = [e + n for e in self.ends]
        self._sync()
        fetched = self.keys[..., :top, :], self.values[..., :top, :]
        if self.window is not None:  # after this pass: the next one's mask is made from the new slots
            self._drop_front(n)
        return fetched

    def _grow(self, keys: mx.array, values: mx.array, top: int) -> None:
        rows, heads, _, kdim = keys.shape
        size = -(-top // STEP) * STEP
        if self.keys is None:
            self.keys = mx.zeros((rows, heads, size, kdim), keys.dtype)
            self.values = mx.zeros((rows, heads, size, values.shape[3]), values.dtype)
            return
        extra = size - self.keys.shape[2]
        self.keys = mx.concatenate([self.keys, mx.zeros((*self.keys.shape[:2], extra, kdim), keys.dtype)], axis=2)
        self.values = mx.concatenate(
            [self.values, mx.zeros((*self.values.shape[:2], extra, self.values.shape[3]), values.dtype)], axis=2)

    def _drop_front(self, written: int) -> None:
        """Slots before every row's window: no later query sees them, even once a verification has
        cut the `written` positions just written back to one."""
        drop = min(self.ends) - written - self.window
        if self.keys is None or drop < STEP:
            return
        self.keys, self.values = self.keys[..., drop:, :], self.values[..., drop:, :]
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
            self.keys, self.values = self.keys[index], self.values[index]
            drop = max(0, min(self.left)) if self.left else 0
            if drop > 0:  # slots no remaining row uses
                self.keys, self.values = self.keys[..., drop:, :], self.values[..., drop:, :]
                self.left = [p - drop for p in self.left]
                self.ends = [e - drop for e in self.ends]
        self._sync()

    def extend(self, other: RowKVCache) -> None:
        if other.keys is None or self.keys is None:
            base = self if self.keys is not None else other
            if base.keys is not None:  # rows with no keys yet get empty buffers of the same width
                empty = other if base is self else self
                shape = (len(empty.ends), *base.keys.shape[1:])
                padded = (mx.zeros(shape, base.keys.dtype), mx.zeros((*shape[:3], base.values.shape[3]),
                                                                      base.values.dtype))
                pairs = [(self.keys, self.values), (other.keys, other.values)]
                pairs[0 if base is other else 1] = padded
                self.keys = mx.concatenate([pairs[0][0], pairs[1][0]])
                self.values = mx.concatenate([pairs[0][1], pairs[1][1]])
        else:
            size = max(self.keys.shape[2], other.keys.shape[2])

            def wide(a: mx.array) -> mx.array:
                return a if a.shape[2] == size else mx.pad(a, [(0, 0), (0, 0), (0, size - a.shape[2]), (0, 0)])

            self.keys = mx.concatenate([wide(self.keys), wide(other.keys)])
            self.values = mx.concatenate([wide(self.values), wide(other.values)])
        self.left += other.left
        self.ends += other.ends
        self._sync()

    def extract(self, idx: int) -> Any:
        """Row `idx` as a single-row cache holding exactly its tokens (its window's, for a window)."""
        from mlx_lm.models.cache import KVCache, RotatingKVCache

        lo, hi = self.left[idx], self.ends[idx]
        cache = KVCache() if self.window is None else RotatingKVCache(self.window)
        if self.window is not None:
            lo = max(lo, hi - self.window)
        cache.keys = mx.contiguous(self.keys[idx:idx + 1, :, lo:hi])
        cache.values = mx.contiguous(self.values[idx:idx + 1, :, lo:hi])
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
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes
