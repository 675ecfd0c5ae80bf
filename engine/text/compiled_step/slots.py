"""Key/value storage of fixed capacity: every attention layer's keys and values in `[slots,
kv_heads, capacity, head_dim]` arrays, a row of the batch in each occupied slot; a recurrent layer's
(qwen3_5's linear attention) state in arrays of `[slots, ...]`, whatever the row's length.

A slot holds its row's tokens at positions `start .. end - 1` (a row that joined from a left-padded
batch keeps its padding in front) and writes the next one at `end`; the step reads `starts` and
`ends` as arrays, so its trace holds for every step until the shape changes. The shape changes
only by whole buckets: slots a power of two, capacity a multiple of `STEP` tokens. Growing copies
the storage once into the larger shape; a row leaving frees its slot and copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STEP = 256  # capacity grows by this many tokens (mlx-lm's own cache step)
MIN_SLOTS = 1


def slot_bucket(rows: int) -> int:
    return max(MIN_SLOTS, 1 << max(0, rows - 1).bit_length())


def capacity_for(tokens: int) -> int:
    return max(STEP, -(-tokens // STEP) * STEP)


@dataclass(frozen=True)
class State:
    """One array of a recurrent layer's state, a row's shape: mlx-lm's `ArraysCache` entry less its
    batch axis. `dtype` None: the store's (that of the keys and values)."""

    shape: tuple[int, ...]
    dtype: Any = None


class SlotStore:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: Any = None,
                 recurrent: dict[int, tuple[State, ...]] | None = None) -> None:
        """`layers` of the model, those in `recurrent` holding the states named there (the rest keys
        and values); `dtype`: the keys' and values', None for that of the first rows adopted."""
        self.layers, self.kv_heads, self.head_dim, self.dtype = layers, kv_heads, head_dim, dtype
        self.recurrent = dict(recurrent or {})
        self.keys: list[Any] = []  # one per attention layer, in order
        self.values: list[Any] = []
        self.states: list[Any] = []  # one per state of each recurrent layer, in order
        self.slots = 0
        self.capacity = 0
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.used: list[bool] = []

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys + self.values + self.states)

    @property
    def attention_layers(self) -> int:
        return self.layers - len(self.recurrent)

    def _state_specs(self) -> list[State]:
        return [spec for layer in sorted(self.recurrent) for spec in self.recurrent[layer]]

    def _state_dtype(self, spec: State) -> Any:
        import mlx.core as mx

        return spec.dtype or self.dtype or mx.float32

    def occupied(self) -> int:
        return sum(self.used)

    def reshape(self, slots: int, capacity: int) -> None:
        """Storage for `slots` rows of `capacity` tokens, the occupied slots' contents kept in place
        (a smaller shape keeps only the slots and tokens below it: the caller compacts first)."""
        import mlx.core as mx

        if (slots, capacity) == (self.slots, self.capacity):
            return
        shape = (slots, self.kv_heads, capacity, self.head_dim)
        if self.slots == 0:
            self.keys = [mx.zeros(shape, self.dtype) for _ in range(self.attention_layers)]
            self.values = [mx.zeros(shape, self.dtype) for _ in range(self.attention_layers)]
            self.states = [mx.zeros((slots, *spec.shape), self._state_dtype(spec)) for spec in self._state_specs()]
        else:
            keep_s, keep_c = min(slots, self.slots), min(capacity, self.capacity)

            def moved(a: Any) -> Any:
                a = a[:keep_s, :, :keep_c]
                return mx.pad(a, [(0, slots - keep_s), (0, 0), (0, capacity - keep_c), (0, 0)])

            self.keys = [moved(a) for a in self.keys]
            self.values = [moved(a) for a in self.values]
            if slots != self.slots:
                self.states = [mx.pad(a[:keep_s], [(0, slots - keep_s)] + [(0, 0)] * (a.ndim - 1))
                               for a in self.states]
        mx.eval(self.keys, self.values, self.states)
        grow = slots - self.slots
        if grow > 0:
            self.starts += [0] * grow
            self.ends += [0] * grow
            self.used += [False] * grow
        else:
            del self.starts[slots:], self.ends[slots:], self.used[slots:]
        self.slots, self.capacity = slots, capacity

    def ensure(self, rows: int, tokens: int) -> None:
        """Room for `rows` occupied slots and for every slot to hold `tokens` tokens."""
        slots = max(self.slots, slot_bucket(rows))
        capacity = max(self.capacity, capacity_for(tokens))
        self.reshape(slots, capacity)

    def adopt(self, caches: list[Any]) -> list[int]:
        """The rows of a batch's caches (one mlx-lm `BatchKVCache` per attention layer, one
        `ArraysCache` per recurrent layer) copied into free slots, one copy per array for all of
        them; their slots, in row order."""
        import mlx.core as mx

        attention = [c for i, c in enumerate(caches) if i not in self.recurrent]
        arrays = [c for i, c in enumerate(caches) if i in self.recurrent]
        first = attention[0]
        rows = int(first.offset.shape[0])
        width = first._idx if first.keys is not None else 0
        if self.dtype is None and first.keys is not None:
            self.dtype = first.keys.dtype
        mx.eval(first.left_padding)
        paddings = [int(p) for p in first.left_padding.tolist()]
        self.ensure(self.occupied() + rows, width + 1)
        free = [s for s in range(self.slots) if not self.used[s]][:rows]
        where = mx.array(free, dtype=mx.int32)
        for layer, cache in enumerate(attention):
            if width == 0:
                continue
            self.keys[layer][where, :, :width] = cache.keys[:, :, :width]
            self.values[layer][where, :, :width] = cache.values[:, :, :width]
        states = [a for cache in arrays for a in cache.cache]
        for store, state in zip(self.states, states, strict=True):
            # A state the prefill did not write (a prompt of one token) starts from zeros, as mlx-lm's.
            store[where] = mx.zeros((rows, *store.shape[1:]), store.dtype) if state is None else state
        for slot, padding in zip(free, paddings, strict=True):
            self.starts[slot], self.ends[slot], self.used[slot] = padding, width, True
        return free

    def release(self, slots: list[int]) -> None:
        for s in slots:
            self.starts[s], self.ends[s], self.used[s] = 0, 0, False

    def extract(self, slot: int) -> list[Any]:
        """A slot's row as mlx-lm's caches of one row: a `KVCache` per attention layer, an
        `ArraysCache` per recurrent one (a finished row's, for the prompt cache)."""
        import mlx.core as mx
        from mlx_lm.models.cache import ArraysCache, KVCache

        start, end = self.starts[slot], self.ends[slot]
        pairs = iter(zip(self.keys, self.values, strict=True))
        states = iter(self.states)
        out: list[Any] = []
        for layer in range(self.layers):
            if layer in self.recurrent:
                cache = ArraysCache(len(self.recurrent[layer]))
                cache.cache = [mx.contiguous(next(states)[slot:slot + 1]) for _ in self.recurrent[layer]]
                out.append(cache)
                continue
            keys, values = next(pairs)
            row = KVCache()
            row.keys = mx.contiguous(keys[slot:slot + 1, :, start:end])
            row.values = mx.contiguous(values[slot:slot + 1, :, start:end])
            row.offset = end - start
            out.append(row)
        return out

    def compact(self, slots: list[int]) -> list[int]:
        """Move the rows in `slots` (in order) to slots 0.. and shrink the storage to their bucket
        and length: one gather per layer. Their new slots, in order."""
        import mlx.core as mx

        rows = len(slots)
        bucket = slot_bucket(rows)
        longest = max((self.ends[s] for s in slots), default=0)
        capacity = capacity_for(longest + 1)
        order = slots + [s for s in range(self.slots) if s not in set(slots)][: bucket - rows]
        where = mx.array(order, dtype=mx.int32)
        self.keys = [a[where, :, :capacity] for a in self.keys]
        self.values = [a[where, :, :capacity] for a in self.values]
        self.states = [a[where] for a in self.states]
        mx.eval(self.keys, self.values, self.states)
        starts = [self.starts[s] for s in slots]
        ends = [self.ends[s] for s in slots]
        self.slots, self.capacity = bucket, capacity
        self.starts = starts + [0] * (bucket - rows)
        self.ends = ends + [0] * (bucket - rows)
        self.used = [True] * rows + [False] * (bucket - rows)
        return list(range(rows))
