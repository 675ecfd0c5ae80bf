"""Drafts from a smaller model of the same tokenizer, run batched beside the target.

The draft model keeps its own key/value cache for every row of the batch (a `RowKVCache`, rows in
the batch's order), always holding a prefix of the row's text. A proposal feeds each drafting row
what its cache lacks (usually the one token sampled last, or two after a fully accepted run) in one
batched pass, then one token a pass, taking the draft model's most likely token each time (a point
mass, so the target's verification keeps its own distribution). After verification each row's
cache is cut back to the drafts that were accepted. A joining row's prompt is read by the draft
model in one pass of its own.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from swama.engine.speculative.row_cache import RowKVCache


class DraftModel:
    def __init__(self, model: Any) -> None:
        self.model = model  # the mlx-lm module
        self.cache: list[RowKVCache] = []

    def _positions(self, row: int) -> int:
        cache = self.cache[0]
        return cache.ends[row] - cache.left[row]

    # -- rows joining and leaving ----------------------------------------------------------------

    def join(self, prompts: list[list[int]]) -> None:
        """Rows joining the batch, each with the tokens its target cache holds."""
        from mlx_lm.models.cache import make_prompt_cache

        for tokens in prompts:
            layers = make_prompt_cache(self.model)
            if tokens:
                self.model(mx.array([tokens]), cache=layers)
            row = [RowKVCache(c.keys, c.values, [0], [c.offset]) for c in layers]
            mx.eval([c.keys for c in row if c.keys is not None])
            if not self.cache:
                self.cache = row
            else:
                for mine, new in zip(self.cache, row, strict=True):
                    mine.extend(new)

    def filter(self, keep: list[int]) -> None:
        for cache in self.cache:
            cache.filter(keep)
        if not keep:
            self.cache = []

    # -- a step ------------------------------------------------------------------------------------

    def propose(self, contexts: list[list[int] | None], lengths: list[int]) -> list[list[int]]:
        """Up to `lengths[r]` drafted tokens for each row whose context (its tokens and the one it
        sampled last) is given; rows without one take part padded and keep nothing."""
        rows = len(contexts)
        drafts: list[list[int]] = [[] for _ in range(rows)]
        wanted = [n if c is not None else 0 for c, n in zip(contexts, lengths, strict=True)]
        if not any(wanted):
            return drafts
        pending = [c[self._positions(i):] if wanted[i] else [] for i, c in enumerate(contexts)]
        width = max(len(p) for p in pending)
        inputs = mx.array([p + [0] * (width - len(p)) for p in pending])
        logits = self.model(inputs, cache=self.cache)
        last = mx.array([max(len(p) - 1, 0) for p in pending])
        token = mx.argmax(logits[mx.arange(rows), last], axis=-1)
        self._keep([len(p) for p in pending], width)
        for step in range(max(wanted)):
            token_list = token.tolist()
            for i in range(rows):
                if step < wanted[i]:
                    drafts[i].append(token_list[i])
            if step + 1 == max(wanted):
                break
            feeding = [step + 1 < wanted[i] for i in range(rows)]  # the last draft is not fed
            logits = self.model(token[:, None], cache=self.cache)
            token = mx.argmax(logits[:, -1], axis=-1)
            self._keep([int(f) for f in feeding], 1)
        return drafts

    def _keep(self, kept: list[int], width: int) -> None:
        for cache in self.cache:
            cache.trim_rows([width - k for k in kept])

    def settle(self, drafted: list[int], accepted: list[int]) -> None:
        """After verification: each row's cache keeps the drafts that were accepted (it holds all but
        the last of the ones it drafted)."""
        cut = [max(d - 1, 0) - min(a, max(d - 1, 0)) for d, a in zip(drafted, accepted, strict=True)]
        for cache in self.cache:
            cache.trim_rows(cut)
