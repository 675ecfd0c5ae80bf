"""Admission: prompts waiting for a row of the batch, read together in as few forwards as the token
budget allows.

A request joins with its prompt and a cache (fresh, or resumed from the prompt cache). Every turn
`step()` runs at most one forward over a group of waiting prompts, at most `budget` tokens in all
(rows x padded length), so decode steps between them keep the streams already running moving.
While rows decode, a new group may wait up to `wait` turns for more prompts to read with (fewer than
a forward's worth are waiting): requests arrive one by one, and on a GPU a forward over one prompt
costs nearly what one over sixteen does (the host launching its operations sets the time), so
reading each as it comes spent most of a burst's turns on prefill. The wait counts turns, not
seconds, so the ranks of a split model, which run the same turns, decide alike. The forward is
launched, not waited for: the decode step after it is built while the device reads the prompts. A
prompt longer than its share is read in chunks over several turns; a group keeps its batched cache
until every prompt in it is read. A prompt leaves with everything but its last token in its own
cache: its first decode step feeds that token, as mlx-lm's batch does. Prompts read together leave
together, their cache still the group's batched one (`Ready.cache`, one batch cache per layer, a row
per prompt), so joining the generation batch copies no row by itself.

On a GPU every prefill forward takes its shape from a small set: rows a power of two, the length a
power of two (at least `MIN_LENGTH`), and every prompt of the group at the same cache offset, a
multiple of `ALIGN` (a resumed prefix is cut back to one). MLX builds a cuDNN attention graph for
each new shape of a prefill's attention (rows, query and key lengths, strides and mask), which
takes a long while with the device idle; with shapes drawn from a small set, each is built once and
reused. On the CPU nothing is built per shape and padding costs compute, so shapes are exact there.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from swama.engine.adapters.bank import selected
from swama.engine.text.kv_quant import as_quantized, merged

MIN_LENGTH = 16  # the shortest padded prefill length on a GPU
ALIGN = 256  # on a GPU, prefill starts at a cache offset that is a multiple of this (mlx-lm's cache step)


def bucket(n: int) -> int:
    """The padded length of `n` tokens on a GPU: the next power of two, at least MIN_LENGTH."""
    return max(MIN_LENGTH, 1 << (n - 1).bit_length())


def aligned(reused: int, bucketed: bool) -> int:
    """How much of a resumed prefix a prompt keeps: all of it on the CPU, a multiple of ALIGN on a GPU."""
    return reused - reused % ALIGN if bucketed else reused


@dataclass(eq=False)
class Pending:
    """A prompt being read: `ids` whole, its cache holding the first `done` tokens."""

    rid: int
    ids: list[int]
    cache: list[Any]
    done: int
    extra: Any = None  # what the caller needs once the prompt is read (its row's sampling and budget)
    arrived: int = 0  # the admission's turn when it was added
    batch: bool = False  # a batch job's line: read after the live prompts waiting with it
    slot: int = 0  # its LoRA adapter's slot in the model's bank (engine/adapters/); 0: none
    salt: str | None = None  # that adapter's id

    @property
    def left(self) -> int:
        """Tokens still to read: all but the last."""
        return len(self.ids) - 1 - self.done


@dataclass(eq=False)
class Ready:
    """Prompts read: row i holds rows[i].ids[:-1] in `cache`, which is one cache per layer: a batch
    cache with a row per prompt (`batched`), or, for one prompt resumed whole from the prompt cache,
    that prompt's own."""

    rows: list[Pending]
    cache: list[Any]
    batched: bool = True


@dataclass(eq=False)
class _Group:
    rows: list[Pending]
    cache: list[Any] | None = None  # the rows' caches merged, once the first chunk is read

    def nbytes(self) -> int:
        if self.cache is not None:
            return sum(c.nbytes for c in self.cache)
        return sum(c.nbytes for row in self.rows for c in row.cache)


@dataclass
class Admission:
    model: Any  # mlx-lm's module: token ids and a cache in, logits out
    budget: int  # tokens one prefill forward reads, over all its rows
    bucketed: bool  # shapes from a small set (a GPU), or exact (the CPU)
    max_rows: int = 64  # prompts one forward reads at most
    wait: int = 0  # turns a prompt may wait for others to be read with while rows decode
    kv: Any = None  # quantized key/value caches (engine/text/kv_quant.py KVQuant), None at full precision
    loaded: Any = None  # the LoadedModel, whose adapter bank (if any) each forward selects rows' adapters in
    waiting: deque[Pending] = field(default_factory=deque)
    group: _Group | None = None
    turns: int = 0

    def add(self, row: Pending) -> None:
        row.arrived = self.turns
        if not row.batch:  # live prompts go before the batch lines waiting
            for i, other in enumerate(self.waiting):
                if other.batch:
                    self.waiting.insert(i, row)
                    return
        self.waiting.append(row)

    def __len__(self) -> int:
        return len(self.waiting) + (len(self.group.rows) if self.group is not None else 0)

    def __contains__(self, rid: int) -> bool:
        rows = [*self.waiting, *(self.group.rows if self.group is not None else [])]
        return any(r.rid == rid for r in rows)

    @property
    def nbytes(self) -> int:
        held = sum(c.nbytes for row in list(self.waiting) for c in row.cache)
        return held + (self.group.nbytes() if self.group is not None else 0)

    def pending(self, rid: int) -> Pending | None:
        """The prompt `rid` while it waits for its first prefill forward (None once read, or gone)."""
        return next((row for row in self.waiting if row.rid == rid), None)

    def drop(self, rid: int) -> bool:
        """Forget a prompt (its client went away); True when it was here."""
        for row in self.waiting:
            if row.rid == rid:
                self.waiting.remove(row)
                return True
        group = self.group
        if group is not None:
            for i, row in enumerate(group.rows):
                if row.rid == rid:
                    self._keep(group, [j for j in range(len(group.rows)) if j != i])
                    return True
        return False

    def ready_now(self) -> list[Ready]:
        """Prompts with nothing left to read (all but their last token resumed from the prompt cache)."""
        done = [r for r in self.waiting if r.left == 0]
        for r in done:
            self.waiting.remove(r)
        return [Ready([r], r.cache, batched=False) for r in done]

    def step(self, decoding: bool = False) -> list[Ready]:
        """One prefill forward of at most `budget` tokens; the prompts it finished. `decoding`: rows are
        generating, so a group of fewer prompts than one forward reads may wait (`wait`)."""
        self.turns += 1
        ready = self.ready_now()
        if self.group is None and self.waiting and not (decoding and self._gathering()):
            self.group = self._form()
        if self.group is not None:
            ready += self._read(self.group)
            if not self.group.rows:
                self.group = None
        return ready

    def _gathering(self) -> bool:
        """Whether the waiting prompts wait another turn for more to be read with: the oldest has waited
        fewer than `wait` turns and less than one forward's worth of them waits."""
        if self.turns - self.waiting[0].arrived > self.wait:
            return False
        tokens = sum(self._padded(r.left) for r in self.waiting)
        return tokens < self.budget and len(self.waiting) < self.max_rows

    # -- one group ------------------------------------------------------------------------------------

    def _form(self) -> _Group:
        """The next group, first come first served: as many waiting prompts as the budget reads in one
        forward (a prompt longer than the budget goes alone, in chunks). On a GPU only prompts at the
        first one's cache offset, and a power of two of them."""
        first = self.waiting[0]
        rows: list[Pending] = []
        longest = 0
        for r in self.waiting:
            if self.bucketed and r.done != first.done:
                continue
            need = max(longest, r.left)
            if rows and (len(rows) == self.max_rows or (len(rows) + 1) * self._padded(need) > self.budget):
                break
            rows.append(r)
            longest = need
        if self.bucketed:
            rows = rows[:1 << (len(rows).bit_length() - 1)]
        for r in rows:
            self.waiting.remove(r)
        return _Group(rows)

    def _padded(self, n: int) -> int:
        return bucket(n) if self.bucketed else n

    def _read(self, group: _Group) -> list[Ready]:
        import mlx.core as mx

        rows = group.rows
        share = max(1, self.budget // len(rows))  # a row's chunk: all of a short prompt's tokens
        if self.bucketed:
            share = 1 << (share.bit_length() - 1)
        chunks = [min(r.left, share) for r in rows]
        length = max(chunks)
        if self.bucketed and length < share:
            length = min(bucket(length), share)
        if group.cache is None:
            group.cache = [merged([r.cache[i] for r in rows]) for i in range(len(rows[0].cache))]
        padding = [length - n for n in chunks]
        tokens = [r.ids[r.done:r.done + n] + [0] * (length - n) for r, n in zip(rows, chunks, strict=True)]
        if any(padding):
            for c in group.cache:
                c.prepare(lengths=chunks, right_padding=padding)
        with selected(self.loaded, [r.slot for r in rows]):
            self.model(mx.array(tokens), cache=group.cache)
        if any(padding):
            for c in group.cache:
                c.finalize()
        if self.kv is not None and self.kv.after:  # once the group's caches hold enough (from the first: at join)
            group.cache = as_quantized(group.cache, self.kv)
        mx.async_eval([c.state for c in group.cache])
        for r, n in zip(rows, chunks, strict=True):
            r.done += n
        finished = [i for i, r in enumerate(rows) if r.left == 0]
        if not finished:
            return []
        if len(finished) == len(rows):  # the usual case: the whole group leaves with its cache
            ready = Ready(rows, group.cache)
            group.rows, group.cache = [], None
            return [ready]
        # Some prompts still have chunks to read: the finished rows leave with a copy of the caches
        # filtered to them (the arrays are shared until either side writes), the others stay.
        left = [i for i in range(len(rows)) if rows[i].left > 0]
        split = [copy.copy(c) for c in group.cache]
        for c in split:
            c.filter(finished)
        ready = Ready([rows[i] for i in finished], split)
        self._keep(group, left)
        return [ready]

    @staticmethod
    def _keep(group: _Group, keep: list[int]) -> None:
        group.rows = [group.rows[i] for i in keep]
        if group.cache is not None and keep:
            for c in group.cache:
                c.filter(keep)
        elif not keep:
            group.cache = None
