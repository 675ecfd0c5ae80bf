"""A per-model prompt cache of several entries: a new request resumes from the entry sharing the
longest token prefix with its prompt, so interleaved conversations each keep their own prefix.

An entry a prompt fully extends is taken out and handed to that request (a row of the batch), and
comes back with every token its cache holds when the row finishes; a prompt that parts from an entry
midway gets a sliced copy. So no two rows of a batch ever write the same arrays. Entries are
evicted least recently used first once their key/value arrays exceed the byte budget. Only caches
that can be cut back to any prefix (plain attention key/value caches) take part; sliding-window and
recurrent layers cannot be cut back, so models with them always prefill in full.

With a disk tier (text/prompt_disk.py) every entry put here is also written to disk in blocks, by a
writer thread, and a prompt the entries cannot serve as far as its blocks on disk reach reads those
blocks back instead: across restarts, unloads and evictions, and across sessions that share a prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swama.engine.model import LoadedModel
from swama.engine.text.kv_policy import kv_quant_of, quantized
from swama.engine.text.kv_quant import as_quantized
from swama.engine.text.prompt_disk import BLOCK, DiskTier, fingerprint

KEPT_PROMPTS = 64  # prompts remembered as asked to be kept (the oldest are forgotten first)


def cacheable(cache: list[Any]) -> bool:
    """Plain attention caches, full precision or quantized (engine/text/kv_quant.py): cut back to any prefix."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    from swama.engine.text.kv_cache import QuantizedRow

    return all(type(c) in (KVCache, QuantizedKVCache, QuantizedRow) for c in cache)


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _prefix_of(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether `a` is a prefix of `b` (compared in C; the last token first, where most part)."""
    n = len(a)
    return n <= len(b) and (n == 0 or a[-1] == b[n - 1]) and a == b[:n]


def prefix_copy(cache: list[Any], n: int) -> list[Any]:
    """New caches holding the first `n` positions: sliced arrays, so writes to one never reach the other."""
    from mlx_lm.models.cache import KVCache

    copies = []
    for layer in cache:
        if quantized(layer):  # a QuantizedRow: the prompt cache keeps its entries as rows
            copies.append(layer.prefix(n))
            continue
        copy = KVCache()
        copy.keys, copy.values, copy.offset = layer.keys[..., :n, :], layer.values[..., :n, :], n
        copies.append(copy)
    return copies


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    cache: list[Any]
    nbytes: int
    kept: bool = False  # it extends a prompt a request asked to keep: evicted after the others
    salt: str | None = None  # a LoRA adapter's id: its rows' keys and values are its own


class PromptCache:
    def __init__(self, budget: int, disk: DiskTier | None = None, layers: int = 0) -> None:
        self.budget = budget
        self.disk = disk  # with the model's layer count, which its blocks must have
        self.layers = layers
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._bytes = 0  # the entries' bytes
        self._next = 0
        self.from_disk = 0  # tokens the last `take` read from the disk tier (0: none, or from memory)
        self.hits = self.misses = self.evicted = 0  # the memory tier's, since the model was loaded
        self._kept: OrderedDict[tuple[int, ...], None] = OrderedDict()  # prompts asked to be kept, newest last

    def keep(self, ids: list[int]) -> None:
        """Keep the cache of this prompt's prefix longer: entries that extend it are evicted after the
        others, and so are its blocks on disk."""
        held = tuple(ids[:-1])
        self._kept[held] = None
        self._kept.move_to_end(held)
        while len(self._kept) > KEPT_PROMPTS:
            self._kept.popitem(last=False)
        if self.disk is not None:
            self.disk.keep(list(held))

    def _evict_one(self) -> None:
        """The least recently used entry that no kept prompt asked for, else the least recently used."""
        key = next((k for k, e in self._entries.items() if not e.kept), next(iter(self._entries)))
        self._bytes -= self._entries.pop(key).nbytes
        self.evicted += 1

    def counters(self) -> dict[str, dict[str, int]]:
        """Per tier: prompts served (hits) and not (misses), bytes held, blocks or entries evicted; the
        disk's also tokens read, bytes written and damaged files removed."""
        tiers = {"memory": {"hits": self.hits, "misses": self.misses, "bytes": self._bytes, "evictions": self.evicted}}
        if self.disk is not None:
            s = self.disk.stats
            tiers["disk"] = {"hits": s.hits, "misses": s.misses, "bytes": self.disk.nbytes, "evictions": s.evicted,
                             "read_tokens": s.read_tokens, "written_bytes": s.written_bytes, "rejected": s.rejected}
        return tiers

    def close(self) -> None:
        """With the model: the blocks handed to the disk tier's writer reach the disk first."""
        if self.disk is not None:
            self.disk.flush()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def take(self, ids: list[int], multiple: int = 1, salt: str | None = None) -> tuple[list[Any] | None, int]:
        """A cache holding the longest prefix of `ids` any entry shares (at most all but the last
        token, which must be run to get logits), cut back to a multiple of `multiple` tokens, and
        that prefix's length; (None, 0) when no entry shares that much. An entry the prompt fully
        extends is handed over; one it parts from midway stays for its own conversation, and the
        prompt gets a copy of the shared part. `salt` (an adapter's id) matches only entries put with
        it, and keeps to the memory tier (the disk's blocks are named by the base model alone)."""
        best, best_len = None, 0
        for key, entry in self._entries.items():
            if entry.salt != salt:
                continue
            tokens = entry.tokens
            # Only an entry sharing more than the best so far matters, and it matches at best_len: one
            # comparison skips the rest (hundreds of entries that share a system prompt, then part).
            if len(tokens) <= best_len or len(ids) <= best_len or tokens[best_len] != ids[best_len]:
                continue
            shared = _common_prefix(tokens, ids)
            if shared > best_len:
                best, best_len = key, shared
        reuse = min(best_len, len(ids) - 1)
        reuse -= reuse % multiple
        self.from_disk = 0
        if self.disk is not None and salt is None and len(ids) - 1 - reuse >= BLOCK:  # blocks may reach further
            names = self.disk.present(ids, len(ids) - 1)
            if len(names) * BLOCK > reuse:
                cache = self.disk.read(ids, names, self.layers)
                found = cache[0].offset if cache is not None else 0
                if found > reuse and found % multiple == 0:
                    self.disk.stats.hits += 1
                    self.from_disk = found
                    return cache, found
            self.disk.stats.misses += 1
        if best is None or reuse <= 0:
            self.misses += 1
            return None, 0
        self.hits += 1
        entry = self._entries[best]
        if reuse == len(entry.tokens):
            del self._entries[best]
            self._bytes -= entry.nbytes
            return entry.cache, reuse
        self._entries.move_to_end(best)
        return prefix_copy(entry.cache, reuse), reuse

    def put(self, tokens: list[int], cache: list[Any], salt: str | None = None) -> None:
        """Keep `cache` (holding `tokens`, computed with the adapter `salt` names) for later requests;
        the oldest entries go past the budget."""
        import mlx.core as mx

        cache = as_quantized(cache, None, rows=True)  # mlx-lm's quantized caches as rows a batch merges
        nbytes = sum(c.nbytes for c in cache)
        if not tokens or (nbytes > self.budget and (self.disk is None or salt is not None)):
            return
        # Evaluated now: a lazy slice of a batch's cache would keep the whole batch's arrays alive.
        mx.eval([c.state for c in cache])
        # An entry that is a prefix of the new one holds nothing the new one lacks.
        held = tuple(tokens)
        for key in [k for k, e in self._entries.items() if e.salt == salt and _prefix_of(e.tokens, held)]:
            self._bytes -= self._entries.pop(key).nbytes
        kept = any(_prefix_of(k, held) for k in self._kept)
        self._entries[self._next] = _Entry(held, cache, nbytes, kept, salt)
        self._bytes += nbytes
        self._next += 1
        while self._bytes > self.budget:
            self._evict_one()
        if self.disk is not None and salt is None:
            self.disk.write(held, cache)


def prompt_cache_for(model: LoadedModel, budget: int, disk_dir: Path | None, disk_bytes: int,
                     shard: str = "") -> PromptCache | None:
    """A model's prompt cache (None for a budget of 0), with a disk tier under `disk_dir` when the
    model's caches can be cut back to any prefix. `shard` names the part of the model this process
    holds on a model split across ranks (each rank's blocks are its own shard's keys and values)."""
    from mlx_lm.models.cache import make_prompt_cache

    from swama.engine.runtime import compute_dtype

    if budget <= 0:
        return None
    caches = make_prompt_cache(model.model)
    if disk_dir is None or not cacheable(caches):
        return PromptCache(budget)
    dtype = compute_dtype()
    kv = kv_quant_of(model)  # quantized blocks are their own: a folder of their own
    name = fingerprint(model.path, str(dtype), (f"kv{kv.bits}g{kv.group_size}" if kv is not None else "") + shard)
    return PromptCache(budget, DiskTier(disk_dir / name, name, disk_bytes), len(caches))


def prompt_cache_of(model: LoadedModel) -> PromptCache | None:
    """The prompt cache beside a model: serving/engine.py keeps its scheduler's there, for the
    requests the scheduler serves alone as well; None where the model keeps none."""
    return model.beside.get(PromptCache)
