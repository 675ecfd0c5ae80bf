"""The generation batch on the compiled step: `LeanBatch` (engine/text/decode_step.py) with its rows
in the slots of a `SlotStore` and its forward the `Decoder`'s trace.

Everything after the logits is the lean batch's own: logits processors (structured output, log
probabilities, penalties, thinking budgets), per-row samplers, stops and token limits see the rows'
logits as they would after mlx-lm's forward. Rows join with the batch cache their prefill left (one
copy per layer into free slots) and leave by freeing their slot; the storage is compacted into a
smaller bucket once a quarter or less of it is in use.
"""

from __future__ import annotations

import time
from typing import Any

from swama.engine.text.compiled_step.forward import Decoder
from swama.engine.text.compiled_step.slots import SlotStore, slot_bucket
from swama.engine.text.decode_step import LeanBatch

SHRINK_BELOW = 4  # compact once the rows fill less than 1/SHRINK_BELOW of the slots


class _StorageView:
    """What mlx-lm's batch bookkeeping asks of `prompt_cache` entries: their bytes."""

    def __init__(self, store: SlotStore) -> None:
        self.store = store

    @property
    def nbytes(self) -> int:
        return self.store.nbytes


class SlotBatch(LeanBatch):
    decoder: Decoder
    store: SlotStore
    slot_of: list[int]

    @classmethod
    def on(cls, decoder: Decoder, model: Any, sampler: Any) -> SlotBatch:
        batch = cls.empty(model, sampler)
        batch.decoder = decoder
        batch._fresh_store()
        return batch

    def _fresh_store(self) -> None:
        self.store = self.decoder.new_store()
        self.slot_of = []
        self.prompt_cache = [_StorageView(self.store)]

    def extract_cache(self, idx: int) -> list[Any]:
        return self.store.extract(self.slot_of[idx])

    def extend(self, batch: Any) -> None:
        if batch.uids:
            self.slot_of += self.store.adopt(batch.prompt_cache)
        batch.prompt_cache = []  # adopted: mlx-lm's merge keeps this batch's own list
        super().extend(batch)

    def filter(self, keep: list[int]) -> None:
        kept = set(keep)
        self.store.release([s for i, s in enumerate(self.slot_of) if i not in kept])
        self.slot_of = [self.slot_of[i] for i in keep]
        views, self.prompt_cache = self.prompt_cache, []
        super().filter(keep)
        self.prompt_cache = views
        if not keep:
            self._fresh_store()  # an idle batch holds no storage
        elif len(keep) * SHRINK_BELOW <= self.store.slots and slot_bucket(len(keep)) < self.store.slots:
            self.slot_of = self.store.compact(self.slot_of)

    def _forward(self, fed: Any) -> Any:
        import mlx.core as mx

        store, slots = self.store, self.slot_of
        rows = len(slots)
        store.ensure(rows, max(store.ends[s] for s in slots) + 1)
        in_place = slots == list(range(rows))
        if in_place:
            tokens = fed if rows == store.slots else mx.pad(fed, (0, store.slots - rows))
        else:
            row_at = [0] * store.slots
            for i, s in enumerate(slots):
                row_at[s] = i
            tokens = fed[mx.array(row_at, dtype=mx.int32)]
        started = time.perf_counter()
        logits, store.keys, store.values, store.states = self.decoder.step(
            tokens, mx.array(store.starts, dtype=mx.int32), mx.array(store.ends, dtype=mx.int32),
            store.keys, store.values, store.states)
        if self.clock is not None:
            self.clock.add("graph", time.perf_counter() - started)
        for s in slots:
            store.ends[s] += 1
        if in_place:
            return logits if rows == store.slots else logits[:rows]
        return logits[mx.array(slots, dtype=mx.int32)]
