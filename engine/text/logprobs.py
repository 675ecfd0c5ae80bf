"""Log probabilities of tokens: the ones a request generates, and a prompt's own.

A value is the model's own next-token distribution at the request's temperature (the logits divided
by it; a temperature of 0, greedy decoding, reads the logits as they are), taken before repetition
penalties and before a structured-output mask: what the model thinks, not what the constraints left.
`top` holds that many most probable tokens, most probable first.

Generated tokens are read by a per-row logits processor (`Recorder`) inside the batch step, so
requests that ask for them decode in the same steps as those that do not; a prompt's tokens are
scored in one forward pass (`prompt_logprobs`).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swama.engine.model import LoadedModel

MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs, and ours


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    token: str  # the token's text; bytes that are not whole UTF-8 characters read as U+FFFD
    logprob: float | None  # None only for a prompt's first token, which nothing before it predicts
    bytes: tuple[int, ...]  # the token's exact bytes


@dataclass(frozen=True)
class TokenLogprob(TopLogprob):
    top: tuple[TopLogprob, ...] = ()


class TokenBytes:
    """Each token id's exact bytes, from the model's tokenizer (byte-level BPE and SentencePiece)."""

    def __init__(self, model: Any) -> None:
        from swama.engine.text.grammar import grammars

        self._ll = grammars(model).ll

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one table per model, kept as long as the model
    def of(self, token_id: int) -> bytes:
        return self._ll.decode_bytes([token_id])

    def entry(self, token_id: int, logprob: float) -> TopLogprob:
        raw = self.of(token_id)
        return TopLogprob(token_id, raw.decode("utf-8", errors="replace"), logprob, tuple(raw))


def token_bytes(model: LoadedModel) -> TokenBytes:
    """The model's table, made once (it walks the vocabulary)."""
    return model.beside.setdefault(TokenBytes, lambda: TokenBytes(model))


def _scaled(logits: Any, temperature: float) -> Any:
    """Log-softmax of the logits at `temperature` (0: as they are), in float32."""
    import mlx.core as mx

    x = logits.astype(mx.float32)
    if temperature > 0 and temperature != 1:
        x = x / temperature
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def _top(lp: Any, k: int) -> tuple[Any, Any]:
    """The indices and values of the `k` largest of each row of `lp`, unsorted (lazy)."""
    import mlx.core as mx

    idx = mx.argpartition(-lp, kth=k - 1, axis=-1)[..., :k]
    return idx, mx.take_along_axis(lp, idx, axis=-1)


class Recorder:
    """A logits processor that reads a row's distribution before any other processor changes it.

    mlx-lm calls a row's processors once per step, for the logits of the token it samples next; the
    readings queue here (still lazy: computed with the step) until the scheduler pairs each with the
    token it produced (`take`)."""

    once_per_token = True  # keeps state per call: speculative steps do not draft for its row

    def __init__(self, temperature: float, top: int) -> None:
        self.temperature = temperature
        self.top = top
        self._queue: deque[tuple[Any, Any, Any]] = deque()

    def __call__(self, tokens: Any, logits: Any) -> Any:
        lp = _scaled(logits[-1] if logits.ndim > 1 else logits, self.temperature)
        self._queue.append((lp, *(_top(lp, self.top) if self.top else (None, None))))
        return logits

    def take(self, token: int, table: TokenBytes) -> TokenLogprob:
        """The reading of the step that sampled `token`."""
        lp, idx, val = self._queue.popleft()
        chosen = table.entry(token, float(lp[token].item()))
        top: tuple[TopLogprob, ...] = ()
        if idx is not None:
            pairs = sorted(zip(val.tolist(), idx.tolist(), strict=True), key=lambda p: (-p[0], p[1]))
            top = tuple(table.entry(i, v) for v, i in pairs)
        return TokenLogprob(chosen.token_id, chosen.token, chosen.logprob, chosen.bytes, top)


def prompt_logprobs(model: Any, ids: list[int], top: int, temperature: float = 1.0,
                    chunk: int = 512) -> list[TokenLogprob]:
    """Each prompt token with its log probability given the tokens before it (the first: None, and
    no alternatives), in forward passes of `chunk` tokens over one cache; `top` alternatives each."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    net = model.model
    table = token_bytes(model)
    cache = make_prompt_cache(net)
    first = table.entry(ids[0], 0.0)
    out = [TokenLogprob(first.token_id, first.token, None, first.bytes)]
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start: start + chunk]
        logits = net(mx.array([piece]), cache=cache)[0]
        nxt = ids[start + 1: start + 1 + len(piece)]
        logits = logits[: len(nxt)]
        lp = _scaled(logits, temperature)
        chosen = mx.take_along_axis(lp, mx.array(nxt)[:, None], axis=-1)[:, 0]
        idx, val = _top(lp, top) if top else (None, None)
        mx.eval(chosen, *(x for x in (idx, val) if x is not None))
        chosen_l = chosen.tolist()
        idx_l = idx.tolist() if idx is not None else None
        val_l = val.tolist() if val is not None else None
        for j, token in enumerate(nxt):
            entry = table.entry(token, chosen_l[j])
            alts: tuple[TopLogprob, ...] = ()
            if idx_l is not None:
                pairs = sorted(zip(val_l[j], idx_l[j], strict=True), key=lambda p: (-p[0], p[1]))
                alts = tuple(table.entry(i, v) for v, i in pairs)
            out.append(TokenLogprob(entry.token_id, entry.token, entry.logprob, entry.bytes, alts))
    return out


Processor = Callable[[Any, Any], Any]
