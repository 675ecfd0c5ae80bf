"""A row's sampler: what picks its next token from the model's log-probabilities, and what
speculative verification needs to keep that choice's distribution (engine/speculative/verify.py):
the filtered distribution it samples from, its temperature, and its random keys.

The filters and their order are mlx-lm's `make_sampler` (top-p, then min-p, then top-k, then
`logprobs / temperature` into a categorical draw). Unseeded rows with one setting share one object
(and mlx-lm's compiled sampler), so a batch of them samples in one call; a seeded row draws from its
own random key, so its output depends on its seed alone.
"""

from __future__ import annotations

import functools
from typing import Any


class Sampler:
    def __init__(self, temperature: float, top_p: float, min_p: float, top_k: int, seed: int | None = None) -> None:
        import mlx.core as mx
        from mlx_lm.sample_utils import make_sampler

        self.temperature = temperature
        self.top_p, self.min_p, self.top_k = top_p, min_p, top_k
        self.greedy = temperature == 0
        self._whole = make_sampler(temp=temperature, top_p=top_p, min_p=min_p, top_k=top_k)
        # Any JSON integer names a seed; MLX takes 64 unsigned bits.
        self._key = mx.random.key(seed % 2**64) if seed is not None and not self.greedy else None

    @property
    def seeded(self) -> bool:
        return self._key is not None

    def filtered(self, logprobs: Any) -> Any:
        """`logprobs` [..., vocab] with the tokens this sampler never picks set to -inf."""
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p:
            logprobs = apply_min_p(logprobs, self.min_p)
        if self.top_k:
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs

    def probabilities(self, logprobs: Any) -> Any:
        """The distribution a draw from `logprobs` [..., vocab] follows (not for greedy rows)."""
        import mlx.core as mx

        return mx.softmax(self.filtered(logprobs) * (1.0 / self.temperature), axis=-1)

    def key(self) -> Any:
        """The next random key of a seeded row; None for an unseeded one (MLX's global generator)."""
        import mlx.core as mx

        if self._key is None:
            return None
        self._key, sub = mx.random.split(self._key)
        return sub

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx

        if self._key is None:
            return self._whole(logprobs)
        return mx.random.categorical(self.filtered(logprobs) * (1.0 / self.temperature), key=self.key())


@functools.lru_cache(maxsize=256)
def shared_sampler(temperature: float, top_p: float, min_p: float, top_k: int) -> Sampler:
    """One sampler object per setting: a batch whose rows all hold the same object samples in one call."""
    return Sampler(temperature, top_p, min_p, top_k)
