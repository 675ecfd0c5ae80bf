"""The test-side K-quant encoder (tools/testmodels/kquants.py) against the `gguf` package's decoder."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quant_shape_to_byte_shape

from tools.testmodels.kquants import quantize

T = GGMLQuantizationType

# Relative RMS error bounds on standard normal data, ~15% above what the encoder measures (noted).
# A uniform quantizer's error is step / sqrt(12), and the step halves with every extra bit.
BOUNDS = {
    T.Q2_K: 0.31,  # 0.269: 4 levels across each 16-value sub-block's range
    T.Q3_K: 0.17,  # 0.146: 8 levels (symmetric, -4..3) per 16 values
    T.Q4_K: 0.085,  # 0.074: 16 levels per 32 values
    T.IQ4_NL: 0.087,  # 0.075: 16 non-uniform levels per 32 values, one fp16 scale per block of 32
    T.IQ4_XS: 0.087,  # 0.076: IQ4_NL's levels with 6-bit sub-block scales under one fp16 scale
    T.Q5_K: 0.043,  # 0.0375: 32 levels per 32 values, half Q4_K's step
    T.Q6_K: 0.021,  # 0.018: 64 levels (symmetric, -32..31) per 16 values, with 8-bit sub-block scales
}
TYPES = list(BOUNDS)


def relative_rms(x: np.ndarray, qtype: GGMLQuantizationType) -> float:
    y = dequantize(quantize(x, qtype), qtype)
    assert y.shape == x.shape and y.dtype == np.float32
    return float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))


@pytest.fixture(scope="module")
def normal() -> np.ndarray:
    return np.random.default_rng(1234).standard_normal((64, 512)).astype(np.float32)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [(512,), (3, 256), (2, 3, 1024)])
def test_byte_layout_sizes(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> None:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    q = quantize(x, qtype)
    assert q.dtype == np.uint8
    assert q.shape == quant_shape_to_byte_shape(shape, qtype)
    assert q.shape[-1] == shape[-1] // block_size * type_size
    assert dequantize(q, qtype).shape == shape


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_row_size_must_fit_blocks(qtype: GGMLQuantizationType) -> None:
    with pytest.raises(ValueError):
        quantize(np.zeros((2, 250), np.float32), qtype)


def test_other_types_are_refused() -> None:
    with pytest.raises(NotImplementedError):
        quantize(np.zeros((1, 256), np.float32), T.IQ2_XXS)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_reconstruction_error_within_bit_width_bound(qtype: GGMLQuantizationType, normal: np.ndarray) -> None:
    assert relative_rms(normal, qtype) < BOUNDS[qtype]
    # The error is relative: a tensor 100 times larger quantizes as well (fp16 scales, no clipping).
    assert relative_rms(normal * 100, qtype) < BOUNDS[qtype]


def test_more_bits_give_smaller_error(normal: np.ndarray) -> None:
    err = {t: relative_rms(normal, t) for t in TYPES}
    assert err[T.Q6_K] < err[T.Q5_K] < err[T.Q4_K] < err[T.Q3_K] < err[T.Q2_K]
    assert err[T.Q5_K] < err[T.IQ4_NL] < err[T.Q3_K]
    assert err[T.Q5_K] < err[T.IQ4_XS] < err[T.Q3_K]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_zeros_stay_zeros(qtype: GGMLQuantizationType) -> None:
    x = np.zeros((2, 512), np.float32)
    x[1, 256:] = np.random.default_rng(5).standard_normal(256)  # zero blocks next to a non-zero one
    y = dequantize(quantize(x, qtype), qtype)
    assert np.array_equal(y[0], x[0]) and np.array_equal(y[1, :256], x[1, :256])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("value", [1.0, -0.37, 3.5e3])
def test_constant_block_up_to_fp16_scale(qtype: GGMLQuantizationType, value: float) -> None:
    # A constant is one level times the block's scales: exact but for the fp16 rounding of the
    # super-block scale (relative 2^-11; the small integer codes multiply exactly).
    x = np.full((1, 256), value, np.float32)
    y = dequantize(quantize(x, qtype), qtype)
    np.testing.assert_allclose(y, x, rtol=2**-11, atol=0)
    assert len(np.unique(y)) == 1


@pytest.mark.parametrize("qtype", [T.Q3_K, T.Q6_K], ids=lambda t: t.name)
def test_constant_power_of_two_is_exact(qtype: GGMLQuantizationType) -> None:
    # The symmetric types map a sub-block's largest value to the lowest level (-4 / -32) and the largest
    # sub-block scale to the lowest code (-32 / -128): a power of two leaves a power-of-two fp16 d.
    x = np.full((2, 256), 0.5, np.float32)
    x[1] = -4.0
    assert np.array_equal(dequantize(quantize(x, qtype), qtype), x)


def q4_k_hand_block() -> tuple[bytes, np.ndarray]:
    """One block_q4_K assembled byte by byte, with the values it stands for."""
    d, dmin = 2.0**-4, 2.0**-5  # fp16 0x2C00 and 0x2800, little-endian
    sc = [1, 63, 10, 33, 20, 47, 5, 60]  # 6-bit scales of the 8 sub-blocks of 32
    mn = [0, 5, 63, 12, 49, 1, 30, 16]  # 6-bit mins
    # bytes 0-3: sc[0..3] | top 2 bits of sc[4..7] << 6  (20 -> 01, 47 -> 10, 5 -> 00, 60 -> 11)
    # bytes 4-7: mn[0..3] | top 2 bits of mn[4..7] << 6  (49 -> 11, 1 -> 00, 30 -> 01, 16 -> 01)
    # bytes 8-11: low nibble of sc[4..7] | low nibble of mn[4..7] << 4
    scales = bytes([0x41, 0xBF, 0x0A, 0xE1, 0xC0, 0x05, 0x7F, 0x4C, 0x14, 0x1F, 0xE5, 0x0C])
    q = [[(p + 3 * j) % 16 for p in range(32)] for j in range(8)]  # each sub-block spans 0..15
    # qs[32g + p]: sub-block 2g's q in the low nibble, sub-block 2g + 1's in the high one.
    qs = bytes(q[2 * g][p] | q[2 * g + 1][p] << 4 for g in range(4) for p in range(32))
    block = bytes([0x00, 0x2C, 0x00, 0x28]) + scales + qs
    values = np.array([d * sc[j] * q[j][p] - dmin * mn[j] for j in range(8) for p in range(32)], np.float32)
    return block, values


def q6_k_hand_block() -> tuple[bytes, np.ndarray]:
    """One block_q6_K assembled byte by byte, with the values it stands for."""
    d = 2.0**-8  # fp16 0x1C00
    sc = [-128, 5, -3, 127, 64, -64, 1, -1, 100, -100, 37, -37, 2, 90, -90, 17]  # int8, per 16 values
    # q in -32..31; each sub-block of 16 holds a -32, its value of largest magnitude.
    q = [-32 if e % 16 == 0 else (e * 5 + 7) % 63 - 31 for e in range(256)]
    u = [v + 32 for v in q]  # stored unsigned, 6 bits
    # ql[64h + p]: low nibbles of elements 128h + p (low) and 128h + 64 + p (high).
    ql = bytes((u[128 * h + p] & 15) | (u[128 * h + 64 + p] & 15) << 4 for h in range(2) for p in range(64))
    # qh[32h + p]: top 2 bits of elements 128h + 32s + p at bits 2s, s = 0..3.
    qh = bytes(
        sum((u[128 * h + 32 * s + p] >> 4) << (2 * s) for s in range(4)) for h in range(2) for p in range(32)
    )
    block = ql + qh + bytes(s & 0xFF for s in sc) + bytes([0x00, 0x1C])
    values = np.array([d * sc[e // 16] * q[e] for e in range(256)], np.float32)
    return block, values


@pytest.mark.parametrize(
    ("qtype", "make"), [(T.Q4_K, q4_k_hand_block), (T.Q6_K, q6_k_hand_block)], ids=["Q4_K", "Q6_K"]
)
def test_hand_assembled_block(
    qtype: GGMLQuantizationType, make: Callable[[], tuple[bytes, np.ndarray]]
) -> None:
    block, values = make()
    assert len(block) == GGML_QUANT_SIZES[qtype][1]
    raw = np.frombuffer(block, np.uint8).reshape(1, -1)
    # The gguf package reads the block as the layout says...
    assert np.array_equal(dequantize(raw, qtype), values.reshape(1, -1))
    # ...and these values, already on the grid (every sub-block spans its levels, the largest
    # scales take the top codes, d is a power of two), encode back to the very same bytes.
    assert quantize(values.reshape(1, -1), qtype).tobytes() == block
