"""Verifying a sampled row's drafts so that its tokens keep the target model's distribution.

Drafts here are deterministic (prompt lookup, or a draft model's most likely token), so the draft
distribution q is a point mass on each drafted token d. Speculative sampling's rule (Leviathan et
al. 2023; Chen et al. 2023) then reads: accept d_j with probability min(1, p_j(d_j) / q(d_j)) =
p_j(d_j); at the first rejection, sample from the residual max(p_j − q, 0), which is p_j with d_j
removed (renormalized by the draw); after m acceptances, sample from p_m. Every emitted token is
then distributed exactly as a plain draw from p. A greedy row needs none of this: it accepts while
a draft equals the argmax, and takes the argmax where it parts.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from swama.engine.text.sampler import Sampler


def verify_sampled(sampler: Sampler, logprobs: mx.array, drafts: list[int]) -> tuple[mx.array, mx.array]:
    """(accepted drafts, next token) of one row, both lazy. `logprobs` [m + 1, vocab] are the
    row's processed log-probabilities at its m draft positions and the one after them."""
    m = len(drafts)
    probs = sampler.probabilities(logprobs)  # [m + 1, vocab]: the distribution a plain draw follows
    drafted = mx.array(drafts, dtype=mx.int32)
    p_draft = mx.take_along_axis(probs[:m], drafted[:, None], axis=-1)[:, 0]
    keys = (sampler.key(), sampler.key())
    uniform = mx.random.uniform(shape=(m,), key=keys[0]) if keys[0] is not None else mx.random.uniform(shape=(m,))
    accepted = mx.sum(mx.cumprod((uniform < p_draft).astype(mx.int32)))
    # Residual distributions: position j without its draft; the last position as it is.
    hit = mx.arange(probs.shape[-1])[None] == drafted[:, None]
    residual = mx.concatenate([mx.where(hit, 0.0, probs[:m]), probs[m:]], axis=0)
    chosen = mx.take(residual, accepted, axis=0)
    logits = mx.log(chosen)
    token = mx.random.categorical(logits, key=keys[1]) if keys[1] is not None else mx.random.categorical(logits)
    return accepted, token


def lazy_arrays(picks: dict[int, tuple[Any, Any]]) -> list[mx.array]:
    return [a for pair in picks.values() for a in pair if a is not None]
