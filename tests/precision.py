"""The precision this test process computes in, and the bounds tests assert under it.

The engine casts floating weights to `compute_dtype()` when it loads a model: float32 on the CPU,
bfloat16 on a GPU, or what `SWAMA_DTYPE` names. The servers the tests start inherit the environment,
so they compute in the same dtype as the models the tests load in process.

A test asserts its float32 bound wherever the engine computes in full float32, and a wider,
stated bound otherwise. bfloat16 keeps 8 significant bits (7 stored and the implicit one): about
2-3 decimal digits, a relative rounding step of 2^-8 ~ 0.4% at every stored intermediate.
"""

from __future__ import annotations

import math
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


# -- two float32 computations of the same values ---------------------------------------------------
#
# float32 keeps 24 significant bits: one correctly rounded operation is off by at most u = 2^-24 of its
# result. Two computations that should agree but sum in another order (another batch shape or
# composition, a cached prefix against a fresh prefill, chunked reads, a compiled step, another thread
# count or BLAS) round apart. A sum of K products rounded in another order moves like a random walk,
# by about sqrt(K) u of its magnitude (Higham's worst case is K u), and the sums along a forward pass
# add up as independent walks: an output moves by about sqrt(P) u of its magnitude, P the products
# that feed it (`forward_products`). The largest gap measured is about that estimate (SmolLM2's
# base row in a batch of three against mlx-lm's model alone: 1.0e-3 on logits reaching 33, where the
# estimate is 9.1e-4; the same on every run, as float32 on one BLAS is deterministic). The bounds
# allow F32_MARGIN times the estimate and stay far under the worst case P u.
F32_UNIT = 2.0 ** -24
F32_MARGIN = 16


def forward_products(layers: int, hidden: int, intermediate: int, head_dim: int, tokens: int) -> int:
    """The products summed along one logit's path through a dense transformer: per layer the
    q/k/v/o and gate/up projections sum over the hidden width (6 H), down over the intermediate one
    (I), attention's scores over a head (d) and its values over the tokens (T); the head over H."""
    return layers * (6 * hidden + intermediate + head_dim + tokens) + hidden


def f32_reordered(magnitude: float, products: int) -> float:
    """The bound on |a - b| for two float32 computations, in another summation order, of values of
    at most `magnitude` fed by `products` products (see above)."""
    return F32_MARGIN * math.sqrt(products) * F32_UNIT * magnitude


# SmolLM2-135M (30 layers, H 576, I 1536, heads of 64) over the tests' 2,048-token contexts: its
# logits reach 44.6 at some position of the tests' prompts (most stay near 32, below), so 48:
# 16 x sqrt(213,120) x 2^-24 x 48 = 0.021.
SMOLLM2_PRODUCTS = forward_products(30, 576, 1536, 64, 2048)
F32_LOGIT = f32_reordered(48, SMOLLM2_PRODUCTS)
# The tiny random models (2 layers, H 64, I 128, heads of 16, contexts of at most 512): logits under 16.
TINY_PRODUCTS = forward_products(2, 64, 128, 16, 512)
F32_TINY_LOGIT = f32_reordered(16, TINY_PRODUCTS)  # 7.0e-4
# A probability moves by p(1-p) <= 1/4 times the change of its log-odds, which two logits' moves
# bound by twice one's: half a logit's bound. A log-probability moves by at most two logits' bounds.
F32_PROBABILITY = F32_LOGIT / 2  # 0.011, SmolLM2
F32_TINY_PROBABILITY = F32_TINY_LOGIT / 2
F32_LOGPROB = 2 * F32_LOGIT
F32_TINY_LOGPROB = 2 * F32_TINY_LOGIT

# -- Python floats ------------------------------------------------------------------------------------
#
# Python's floats are float64 (u = 2^-53, 1.1e-16). Values of order one from a few dozen operations on
# the host (the scorer's and calibration's arithmetic) each add at most one unit roundoff: 1e-12 is
# thousands of times what they can lose, and far under any mistake in the formula. A value the test
# writes with six decimals is within half a unit of its last digit of the exact one.
F64_ARITHMETIC = 1e-12
SIX_DECIMALS = 5e-7


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
