"""Speculative decoding inside continuous batching.

`SpeculativeGenerator` is the lean batch generator (text/decode_step.py) whose generation batch is a
`SpeculativeBatch`.
Each step of that batch either is a plain step (text/decode_step.py: one token a row, the next pass launched
before the last is read back) or, when some rows have drafts worth verifying (engine/speculative/
policy.py), one pass of 1 + m positions for every row:

    row r feeds  [x_r, d_r1 … d_rm]   (x_r: the token it sampled last; d: its drafted tokens, padded)

and reads the model's next-token distributions at all 1 + m positions at once. A row emits x_r and
the drafts its verification accepts (engine/speculative/verify.py), samples its next token from the
position of the first rejection, and its key/value rows are cut back past that position
(engine/speculative/row_cache.py) — each row by its own count. Rows without drafts take their one
token from the same pass; so do seeded rows, whose tokens must depend on the seed alone. Stop sequences, token budgets and cancellation act per emitted token, as
in a plain step; so do the logits processors of sampling penalties (applied at every position with
that position's context). A row whose processors must see every token once (log probabilities, a
grammar) never drafts.

Models whose caches are all attention caches draft, sliding windows included; recurrent state cannot
be cut back per row, so the rows of models with recurrent layers decode plainly (every step a plain one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

from swama.engine.speculative.draft_model import DraftModel
from swama.engine.speculative.ngram import PromptLookup
from swama.engine.speculative.policy import Costs, Row, Speculation, choose_width
from swama.engine.speculative.row_cache import RowKVCache
from swama.engine.speculative.verify import lazy_arrays, verify_sampled
from swama.engine.text.decode_step import LeanBatch, LeanGenerator
from swama.engine.text.kv_cache import BatchQuantizedKVCache
from swama.engine.text.sampler import Sampler

NO_LOGPROBS = None  # speculative tokens carry no log-probability vector (rows asking for them never draft)


@dataclass
class Counters:
    """What drafting did on one model (read by /metrics)."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # speculative steps
    plain_steps: int = 0
    emitted: int = 0  # tokens emitted by speculative steps
    by_uid: dict[int, int] = field(default_factory=dict)  # accepted draft tokens per row, until its owner takes them


def _able(sampler: Any, processors: Any) -> bool:
    """Whether a row may draft. Not a seeded row: how many draws a verification takes depends on
    the batch's pass width, and a seeded row's tokens must depend on its seed alone."""
    return (isinstance(sampler, Sampler) and not sampler.seeded
            and not any(getattr(p, "once_per_token", False) for p in processors or ()))


class SpeculativeBatch(LeanBatch):
    speculation: Speculation = Speculation()
    counters: Counters | None = None
    costs: Costs | None = None
    rows: list[Row | None]

    drafter: DraftModel | None = None
    _known: list[int] | None = None

    @classmethod
    def start(cls, model: Any, fallback_sampler: Any, speculation: Speculation, counters: Counters,
              drafter: DraftModel | None) -> SpeculativeBatch:
        batch = cls.empty(model, fallback_sampler)
        batch.speculation, batch.counters, batch.costs = speculation, counters, Costs(measured=speculation.measured)
        batch.rows, batch.drafter = [], drafter
        batch._modelled = []
        batch._known = None  # the next tokens on the host, when a speculative step has read them
        return batch

    # -- rows joining and leaving ----------------------------------------------------------------

    def extend(self, batch: GenerationBatch) -> None:
        caches = batch.prompt_cache
        convert = self.speculation.on and caches and all(
            type(c) in (BatchKVCache, BatchRotatingKVCache, BatchQuantizedKVCache) for c in caches)
        if convert:
            batch.prompt_cache = [RowKVCache.of(c) for c in caches]
        joining = [Row(able=_able(s, p), greedy=getattr(s, "greedy", False)) if convert else None
                   for s, p in zip(batch.samplers, batch.logits_processors, strict=True)]
        if convert and self.drafter is not None:
            self.drafter.join([list(t) for t in batch.tokens])
        self._known = None  # the joining rows' first tokens are still being sampled
        super().extend(batch)
        self.rows.extend(joining)

    def filter(self, keep: list[int]) -> None:
        super().filter(keep)
        self.rows = [self.rows[i] for i in keep]
        if self._known is not None:
            self._known = [self._known[i] for i in keep]
        if self.drafter is not None:
            self.drafter.filter(keep)

    # -- a step ------------------------------------------------------------------------------------

    def next(self) -> list[Any]:
        if not self.uids:
            return []
        drafts, lasts = self._drafts()
        width = 1
        if drafts is not None:
            width = choose_width(self.speculation.mode, self.rows, drafts, self.costs, len(self.uids))
        started = time.perf_counter()
        if width == 1:
            if any(self._modelled):  # the draft model's proposals go unverified: its caches drop them
                self.drafter.settle(self._modelled, [0] * len(self._modelled))
            self._known = None  # the plain step samples the next tokens lazily
            responses = super().next()
            self.counters.plain_steps += 1
        else:
            responses = self._speculate(lasts, [d[:width - 1] for d in drafts], width)
            self.counters.steps += 1
        self._modelled = []
        self.costs.record(len(self.uids) or 1, width, time.perf_counter() - started)
        return responses

    def _drafts(self) -> tuple[list[list[int]] | None, list[int]]:
        """Every row's draft for this step (None when no row looks: the step stays plain and pipelined)."""
        self._modelled = []  # rows whose drafts came from the draft model: how many each
        resting = self.speculation.mode == "auto"  # ngram verifies every draft it finds
        looking = [r is not None and r.able and not (resting and r.rest) for r in self.rows]
        for r in self.rows:
            if r is not None and r.rest > 0:
                r.rest -= 1
        if not any(looking):
            return None, []
        lasts = self._known
        if lasts is None and self.drafter is not None:
            lasts = self._next_tokens.tolist()  # the draft model reads the last token: wait for its pass
        mode = self.speculation.mode
        drafts: list[list[int]] = []
        rooms: list[int] = []
        for i, row in enumerate(self.rows):
            room = min(self.speculation.max_draft, self.max_tokens[i] - self._num_tokens[i] - 1)  # x is emitted now
            rooms.append(room if looking[i] else 0)
            if not looking[i] or mode == "draft":
                drafts.append([])
                continue
            if row.lookup is None:
                row.lookup = PromptLookup(longest=self.speculation.ngram[1], shortest=self.speculation.ngram[0])
            row.lookup.add(self.tokens[i][len(row.lookup):])
            if lasts is not None:
                drafts.append(row.lookup.draft(lasts[i], room))
            else:
                # The last token is still being sampled: draft from the copy's guess at it; a wrong
                # guess only means the drafts are rejected, and the step never waits before its pass.
                drafts.append(row.lookup.follow(room + 1)[1:])
        self._modelled = [0] * len(drafts)
        if self.drafter is not None:  # the draft model drafts where prompt lookup found nothing
            contexts = [[*self.tokens[i], lasts[i]] if rooms[i] > 0 and not drafts[i] else None
                        for i in range(len(drafts))]
            for i, d in enumerate(self.drafter.propose(contexts, rooms)):
                if d:
                    drafts[i], self._modelled[i] = d, len(d)
        for i, row in enumerate(self.rows):
            if looking[i]:
                row.looked_up(bool(drafts[i]))
                row.idle += 1
        return drafts, lasts

    def _speculate(self, lasts: list[int] | None, drafts: list[list[int]], width: int) -> list[Any]:
        rows = len(self.uids)
        drafted = mx.array([d + [0] * (width - 1 - len(d)) for d in drafts], dtype=mx.uint32)
        inputs = mx.concatenate([self._next_tokens.astype(mx.uint32)[:, None], drafted], axis=1)
        with self.adapted():
            logits = self.model(inputs, cache=self.prompt_cache)
        logits = self._processed(logits, drafts)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)

        greedy = [i for i in range(rows) if drafts[i] and self.rows[i].greedy]
        best = mx.argmax(logprobs[mx.array(greedy)], axis=-1) if greedy else None
        picks: dict[int, Any] = {}  # row: (accepted count, next token), lazy
        for i in range(rows):
            if drafts[i] and not self.rows[i].greedy:
                picks[i] = verify_sampled(self.samplers[i], logprobs[i, :len(drafts[i]) + 1], drafts[i])
            elif not drafts[i]:
                sampler = self.samplers[i] if self.samplers else self.fallback_sampler
                picks[i] = (None, sampler(logprobs[i, :1])[0])
        mx.eval([best] if best is not None else [], lazy_arrays(picks))
        if lasts is None:
            lasts = self._next_tokens.tolist()

        best_rows = dict(zip(greedy, best.tolist(), strict=True)) if greedy else {}
        nexts: list[int] = []
        emitted: list[list[int]] = []
        accepted_drafts: list[int] = []
        for i in range(rows):
            d = drafts[i]
            if i in best_rows:
                argmax = best_rows[i]
                a = 0
                while a < len(d) and argmax[a] == d[a]:
                    a += 1
                nexts.append(argmax[a])
            else:
                count, token = picks[i]
                a = 0 if count is None else int(count.item())
                nexts.append(int(token.item()))
            accepted_drafts.append(a)
            emitted.append([lasts[i], *d[:a]])
            if d:
                self.rows[i].verified(len(d), a)
                self.counters.drafted += len(d)
                self.counters.accepted += a
        if self.drafter is not None:
            self.drafter.settle(self._modelled, accepted_drafts)
        return self._emit(emitted, nexts, accepted_drafts, width)

    def _processed(self, logits: mx.array, drafts: list[list[int]]) -> mx.array:
        """The rows' logits processors at every position a row verifies, each with its own context."""
        if not any(self.logits_processors):
            return logits
        out = []
        for e, processors in enumerate(self.logits_processors):
            if not processors:
                out.append(logits[e])
                continue
            context = self._token_context[e].update_and_fetch(self._next_tokens[e:e + 1].astype(mx.int32))
            positions = []
            for j in range(logits.shape[1]):
                row = logits[e, j:j + 1]
                if j <= len(drafts[e]):
                    seen = context if j == 0 else mx.concatenate([context, mx.array(drafts[e][:j], dtype=mx.int32)])
                    for processor in processors:
                        row = processor(seen, row)
                positions.append(row)
            out.append(mx.concatenate(positions, axis=0))
        return mx.stack(out)

    def _emit(self, emitted: list[list[int]], nexts: list[int], accepted: list[int], width: int) -> list[Any]:
        """Each row's emitted tokens through its stop sequences and budget, the caches cut back to
        them, and the responses (one per token)."""
        finished: dict[int, str] = {}
        kept: list[int] = []
        for i, tokens in enumerate(emitted):
            n = 0
            for token in tokens:
                n += 1
                self._num_tokens[i] += 1
                reason = "length" if self._num_tokens[i] >= self.max_tokens[i] else None
                if self._matchers[i].advance(token):
                    reason = "stop"
                if reason is not None:
                    finished[i] = reason
                    break
            kept.append(n)
            if n > 1:  # the drafts emitted (a stop or the budget may cut accepted ones)
                self.counters.by_uid[self.uids[i]] = self.counters.by_uid.get(self.uids[i], 0) + n - 1
            self.tokens[i].extend(tokens[:n])
            if self.logits_processors and self.logits_processors[i] and n > 1:
                self._token_context[i].update_and_fetch(mx.array(tokens[1:n], dtype=mx.int32))
        cut = [width - n for n in kept]
        for cache in self.prompt_cache:
            cache.trim_rows(cut)
        self.counters.emitted += sum(kept)

        responses = []
        for i in range(len(self.uids)):
            tokens = emitted[i][:kept[i]]
            for j, token in enumerate(tokens):
                last = j == len(tokens) - 1
                reason = finished.get(i) if last else None
                responses.append(self.Response(
                    uid=self.uids[i], token=token, logprobs=NO_LOGPROBS, finish_reason=reason,
                    prompt_cache=self.extract_cache(i) if reason else None,
                    all_tokens=self.tokens[i] if reason else None))
        self._next_tokens = mx.array(nexts, dtype=mx.uint32)
        self._next_logprobs = [_EMPTY] * len(nexts)
        self._known = list(nexts)
        keep = [i for i in range(len(self.uids)) if i not in finished]
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses


_EMPTY = mx.array(0.0)


class SpeculativeGenerator(LeanGenerator):
    """mlx-lm's continuous batching with a `SpeculativeBatch` as its generation batch."""

    def __init__(self, model: Any, *, speculation: Speculation, draft_model: Any = None, clock: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(model, clock=clock, **kwargs)
        self.counters = Counters()
        drafter = DraftModel(draft_model) if draft_model is not None and speculation.mode in ("draft", "auto") else None
        self._generation_batch = SpeculativeBatch.start(model, self.sampler, speculation, self.counters, drafter)
        self._generation_batch.clock = clock
        self._generation_batch.kv = kwargs.get("kv")
