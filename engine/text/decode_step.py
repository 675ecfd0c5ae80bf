"""The batch's decode step, leaner than mlx-lm's own.

mlx-lm's generation batch normalizes every row's logits into log probabilities each step and keeps
one array per row of them, for callers that read them. swama reads none of them (log probabilities
are recorded by its own logits processor, text/logprobs.py), and a greedy row needs only the
largest logit, so a step here normalizes only when a row samples and makes no per-row arrays: on a
GPU at hundreds of rows those arrays alone are hundreds of operations a step for the host to build
and evaluate. Everything else is mlx-lm's batch as it is (pipelining, stops, rows joining and
leaving): `LeanBatch` replaces only the step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from mlx_lm.generate import BatchGenerator, GenerationBatch

from swama.engine.adapters.bank import selected
from swama.engine.text.kv_quant import as_quantized, joined


def _greedy(sampler: Any) -> bool:
    return bool(getattr(sampler, "greedy", False)) or getattr(sampler, "__name__", "") == "greedy_sampler"


class LeanBatch(GenerationBatch):
    clock: Any = None  # the scheduler's TurnClock, when it times the steps' launch and read-back
    _paddings: list[list[int] | None] | None = None  # the rows' left padding per layer, read this step
    kv: Any = None  # quantized key/value caches (engine/text/kv_quant.py): the batch is quantized once due
    loaded: Any = None  # the LoadedModel: its adapter bank (engine/adapters/), when it has one
    adapter_of: dict[int, int] | None = None  # rows with an adapter: uid -> bank slot (the scheduler's)

    def adapted(self) -> Any:
        """Within: this step's forward adds each row's adapter (a no-op when no row has one)."""
        if not self.adapter_of:
            return contextlib.nullcontext()
        return selected(self.loaded, [self.adapter_of.get(uid, 0) for uid in self.uids])

    def extract_cache(self, idx: int) -> list[Any]:
        """Row `idx`'s caches taken out of the batch's (a row that finished). The rows' left paddings
        are read back once a step for every layer, not once a row and a layer (each read a wait for
        the device): at hundreds of rows finishing together those waits were most of the step."""
        import mlx.core as mx
        from mlx_lm.models.cache import BatchKVCache, KVCache

        if self._paddings is None:
            plain = [c for c in self.prompt_cache if type(c) is BatchKVCache]
            mx.eval([c.left_padding for c in plain])
            self._paddings = [c.left_padding.tolist() if type(c) is BatchKVCache else None for c in self.prompt_cache]
        out = []
        for c, paddings in zip(self.prompt_cache, self._paddings, strict=True):
            if paddings is None:
                out.append(c.extract(idx))
                continue
            row = KVCache()
            row.keys = mx.contiguous(c.keys[idx:idx + 1, :, paddings[idx]:c._idx])
            row.values = mx.contiguous(c.values[idx:idx + 1, :, paddings[idx]:c._idx])
            row.offset = row.keys.shape[2]
            out.append(row)
        return out

    def filter(self, keep: list[int]) -> None:
        self._paddings = None
        super().filter(keep)

    def extend(self, batch: Any) -> None:
        self._paddings = None
        self.prompt_cache, batch.prompt_cache = joined(self.prompt_cache, batch.prompt_cache, self.kv)
        super().extend(batch)

    def _forward(self, fed: Any) -> Any:
        """The rows' next-token logits [rows, vocab] for `fed` [rows], their caches advanced."""
        with self.adapted():
            return self.model(fed[:, None], cache=self.prompt_cache)[:, -1, :]

    def _step(self) -> tuple[list[int], list[Any]]:
        import mlx.core as mx

        self._paddings = None
        if self.kv is not None and self.kv.after and self.prompt_cache:  # after 0: every cache arrives quantized
            self.prompt_cache = as_quantized(self.prompt_cache, self.kv)
        fed = self._next_tokens  # the tokens drawn last step: this step feeds them and returns them
        self._current_tokens, self._current_logprobs = fed, self._next_logprobs
        logits = self._forward(fed)
        contexts: list[Any] = []
        if any(self.logits_processors):
            rows = []
            for i, processors in enumerate(self.logits_processors):
                row = logits[i:i + 1]
                if processors:
                    context = self._token_context[i].update_and_fetch(fed[i:i + 1])
                    contexts.append(context)
                    for processor in processors:
                        row = processor(context, row)
                rows.append(row)
            logits = mx.concatenate(rows, axis=0)
        samplers = [s if s is not None else self.fallback_sampler for s in (self.samplers or [None] * len(self.uids))]
        if not all(_greedy(s) for s in samplers):  # samplers filter and draw from log probabilities
            logits = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if all(s is samplers[0] for s in samplers):
            drawn = samplers[0](logits)
        else:
            drawn = mx.concatenate([s(logits[i:i + 1]) for i, s in enumerate(samplers)], axis=0)
        self._next_tokens = drawn
        self._next_logprobs = [None] * len(self.uids)
        launched = time.perf_counter()
        mx.async_eval(drawn, contexts)  # the next step computes while this one's tokens are read back
        read = time.perf_counter()
        tokens = fed.tolist()
        if self.clock is not None:
            self.clock.add("launch", read - launched)
            self.clock.add("wait", time.perf_counter() - read)
        for held, token in zip(self.tokens, tokens, strict=True):
            held.append(token)
        return tokens, self._current_logprobs


class LeanGenerator(BatchGenerator):
    """mlx-lm's continuous batching with a `LeanBatch` as its generation batch, which rows whose
    prompts were read elsewhere (engine/serving/admission.py) join with their batched cache as it is."""

    def __init__(self, model: Any, *, clock: Any = None, make_batch: Callable[[Any, Any], LeanBatch] | None = None,
                 kv: Any = None, **kwargs: Any) -> None:
        """`make_batch(model, sampler)`: the empty generation batch (a `LeanBatch` by default; the
        compiled step's `SlotBatch`)."""
        super().__init__(model, **kwargs)
        self._generation_batch = (make_batch or LeanBatch.empty)(model, self.sampler)
        self._generation_batch.clock = clock
        self._generation_batch.kv = kv
        self.clock = clock

    def adapt(self, loaded: Any, slot_of: dict[int, int]) -> None:
        """Let the generation batch's forwards add the rows' adapters: `slot_of` maps a row's uid to its
        slot in `loaded`'s adapter bank (rows without one are absent)."""
        self._generation_batch.loaded, self._generation_batch.adapter_of = loaded, slot_of

    def join_prefilled(self, cache: list[Any], last_tokens: list[int], held: list[list[int]],
                       samplers: list[Any], processors: list[list[Any]], stops: list[Any],
                       max_tokens: list[int]) -> list[int]:
        """Rows whose prompts, all but each one's last token, are in `cache` (one batch cache per
        layer, a row per prompt, `held[i]` the tokens row i holds) join the generation batch; their
        first step feeds `last_tokens`. Their uids, in order. No row's cache is copied by itself:
        mlx-lm's own insert would take a cache per row and merge them."""
        import mlx.core as mx

        uids = list(range(self._uid_count, self._uid_count + len(last_tokens)))
        self._uid_count += len(uids)
        batch = LeanBatch(self.model, uids, mx.array(last_tokens, dtype=mx.uint32), cache, held, samplers,
                          self.sampler, [tuple(p) for p in processors], stops, max_tokens)
        self._generation_batch.extend(batch)
        return uids
