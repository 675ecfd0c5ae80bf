"""The prompt cache's bookkeeping over many entries: the longest shared prefix wins however many
entries share a system prompt, an entry the new one extends is dropped, and the byte count follows
every entry in and out."""

from __future__ import annotations

import random

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from swama.engine.text.prompt_cache import PromptCache

SYSTEM = list(range(100, 130))  # 30 tokens every prompt opens with


def _cache(tokens: list[int]) -> list[KVCache]:
    """Two layers whose keys hold each position's token, so a cut is checkable."""
    layers = []
    for _ in range(2):
        c = KVCache()
        held = mx.array(tokens, dtype=mx.float32).reshape(1, 1, len(tokens), 1)
        c.update_and_fetch(held, held)
        layers.append(c)
    return layers


def _conversations(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [SYSTEM + [1000 + i] + [rng.randrange(200, 900) for _ in range(rng.randrange(5, 40))] for i in range(count)]


def test_the_longest_shared_prefix_wins_among_entries_sharing_a_system_prompt() -> None:
    store = PromptCache(1 << 30)
    prompts = _conversations(60)
    for p in prompts:
        store.put(p, _cache(p))
    assert len(store) == 60 and store.nbytes == sum(sum(c.nbytes for c in _cache(p)) for p in prompts)

    follow = prompts[37] + [7, 8, 9]  # the next turn of conversation 37: its entry is handed over
    cache, reused = store.take(follow)
    assert reused == len(prompts[37]) and len(store) == 59
    assert cache[0].keys[0, 0, :cache[0].offset, 0].tolist() == [float(t) for t in prompts[37]]
    assert store.nbytes == sum(sum(c.nbytes for c in _cache(p)) for i, p in enumerate(prompts) if i != 37)

    stranger = SYSTEM + [5, 6, 7]  # shares the system prompt alone: a copy of those 30 tokens, cut to 8s
    cache, reused = store.take(stranger, multiple=8)
    assert reused == 24 and len(store) == 59 and cache[1].keys.shape[2] == 24
    assert store.take([1, 2, 3]) == (None, 0)


def test_an_entry_the_new_one_extends_is_dropped_and_the_budget_holds() -> None:
    store = PromptCache(1 << 30)
    a = SYSTEM + [1, 2, 3]
    store.put(a, _cache(a))
    store.put(a + [4, 5], _cache(a + [4, 5]))  # a's conversation went on: its old entry goes
    assert len(store) == 1 and store.take(a + [4, 5, 6])[1] == len(a) + 2
    one = sum(c.nbytes for c in _cache(a))
    store.budget = 3 * one
    for p in _conversations(10, seed=1):
        store.put(p[:len(a)], _cache(p[:len(a)]))
        assert store.nbytes <= store.budget
    assert len(store) == 3
