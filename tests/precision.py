"""The precision this test process computes in, and the bounds tests assert under it.

The engine casts floating weights to `compute_dtype()` when it loads a model: float32 on the CPU,
bfloat16 on a GPU, or what `SWAMA_DTYPE` names. The servers the tests start inherit the environment,
so they compute in the same dtype as the models the tests load in process.

A test asserts its float32 bound wherever the engine computes in full float32, and a wider,
stated bound otherwise. bfloat16 keeps 8 significant bits (7 stored and the implicit one): about
2-3 decimal digits, a relative rounding step of 2^-8 ~ 0.4% at every stored intermediate.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import mlx.core as mx

from swama.engine.model import LoadedModel
from swama.engine.runtime import compute_dtype, on_gpu

DTYPE = compute_dtype()
DTYPE_NAME = {mx.float32: "float32", mx.bfloat16: "bfloat16", mx.float16: "float16"}[DTYPE]
IS_F32 = DTYPE == mx.float32
IS_BF16 = DTYPE == mx.bfloat16
IS_F16 = DTYPE == mx.float16
ON_GPU = on_gpu()
# MLX runs float32 matmuls on a GPU as TF32 (10 stored mantissa bits) unless MLX_ENABLE_TF32=0.
TF32 = IS_F32 and ON_GPU and os.environ.get("MLX_ENABLE_TF32", "1") != "0"
FULL_F32 = IS_F32 and not TF32


def tol(float32: float, bfloat16: float) -> float:
    """The bound for the dtype this process computes in: `float32` in full float32, `bfloat16`
    otherwise. float16 (11 significant bits) and TF32 matmuls (11 too) round finer than bfloat16,
    so a bound that holds for bfloat16 holds for them as well."""
    assert bfloat16 >= float32, "a bfloat16 bound is never tighter than the float32 one"
    return float32 if FULL_F32 else bfloat16


# -- two bfloat16 computations of the same logits -------------------------------------------------
#
# Two computations that should agree (other batch shapes, a cached prefix against a fresh prefill,
# a split vocabulary projection against the whole model, other GPU kernels) round apart in bfloat16.
# Its numbers between 2^k and 2^(k+1) lie 2^(k-7) apart: SmolLM2's logits reach about 32 (a step of
# 0.125 below it); the tiny random models' stay under 16 (a step of 0.0625). Each computation may put a
# logit a step off by its last rounding and another by the 2^-8 roundings of the hidden state before
# it, so the gap between two logits may move by four steps.
BF16_LOGIT_STEP = 0.125
BF16_TINY_LOGIT_STEP = 0.0625
# A top-two logit gap under this may turn around between two computations: greedy tokens part there.
BF16_NEAR_TIE = 4 * BF16_LOGIT_STEP  # 0.5
# A softmax probability moves by p(1-p) times the change of its log-odds, at most a quarter of it:
# four steps of log-odds move it by one step's worth.
BF16_PROBABILITY = BF16_LOGIT_STEP  # 0.125, SmolLM2
BF16_TINY_PROBABILITY = BF16_TINY_LOGIT_STEP  # 0.0625, the tiny random models


def parting(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Where two token sequences part: the first index at which they differ, or the length of the
    shorter one when it stopped (its end of turn against the other's next token); None when equal."""
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top_two_gap(model: LoadedModel, ids: Sequence[int]) -> float:
    """The gap between the two largest next-token logits after `ids`, from one fresh forward pass."""
    logits = model.model(mx.array([list(ids)]))[0, -1].astype(mx.float32)
    low, high = mx.sort(logits)[-2:].tolist()
    return high - low
