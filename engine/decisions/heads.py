"""Logits at chosen positions only.

A language model's forward pass ends in its vocabulary projection, the largest matrix of a small
model: a 1,000-token prefix of SmolLM2 spends a fifth of its compute producing 49,152 logits for
every position, and a batch of decision suffixes spends most of its memory on them. Decision scoring
needs the logits of one position per row, so where a model splits into a body (the transformer,
ending in its final norm) and a head (the projection), the body runs over every token and the head
over the chosen positions alone.

The split is taken only where it is verified: once per loaded model, the body and head must give
the same logits as the whole model on a probe input. A model whose forward does more after the head
(soft-capping, logit scales) fails that check and keeps the whole forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Head = tuple[Callable[..., Any], Callable[[Any], Any]]
_PROBE = [[1, 2, 3, 4, 5, 6, 7, 8]]


def _candidate(net: Any) -> Head | None:
    body = getattr(net, "model", None)
    if body is None or not callable(body) or not type(net).__module__.startswith("mlx_lm.models."):
        return None
    lm_head = getattr(net, "lm_head", None)
    args = getattr(net, "args", None)
    tied = getattr(args, "tie_word_embeddings", lm_head is None)
    if lm_head is not None and not tied:
        return body, lm_head
    embed = getattr(body, "embed_tokens", None)
    if embed is not None and hasattr(embed, "as_linear"):
        return body, embed.as_linear
    return None


def _verified(net: Any, split: Head) -> bool:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    body, head = split
    tokens = mx.array(_PROBE)
    try:
        whole = net(tokens, cache=make_prompt_cache(net))
        parts = head(body(tokens, cache=make_prompt_cache(net)))
        mx.eval(whole, parts)
    except Exception:  # a body with another signature: keep the whole forward
        return False
    return whole.shape == parts.shape and bool(mx.array_equal(whole, parts).item())


def head_split(net: Any) -> Head | None:
    """The model's verified (body, head), or None (the scorer keeps the verdict per loaded model)."""
    split = _candidate(net)
    return split if split is not None and _verified(net, split) else None


def logits_at(net: Any, split: Head | None, tokens: Any, cache: Any, rows: Any, columns: Any) -> Any:
    """Logits of `tokens` ([batch, width]) at positions (rows[i], columns[i]), as float32 [n, vocab]."""
    import mlx.core as mx

    if split is None:
        out = net(tokens, cache=cache)
        return out[rows, columns].astype(mx.float32)
    body, head = split
    hidden = body(tokens, cache=cache)
    return head(hidden[rows, columns]).astype(mx.float32)


def fill_cache(net: Any, tokens: Any, cache: Any, **kwargs: Any) -> None:
    """Run `tokens` into `cache` and evaluate only the cache: no logits are computed."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    net(tokens, cache=cache, **kwargs)
    states = [(c.state, getattr(c, "meta_state", None)) for c in cache]
    mx.eval([leaf for _, leaf in tree_flatten([s for s, _ in states]) if isinstance(leaf, mx.array)])
