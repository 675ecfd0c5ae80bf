"""A numpy encoder for GGUF's K-quant (and IQ4_NL / IQ4_XS) tensor types, for tests.

The `gguf` package dequantizes these types (`gguf.quants.dequantize`) but cannot quantize them,
so tests that write K-quant GGUF files encode their tensors with `quantize` here and the reader
under test (through the `gguf` package) decodes them. The bytes follow ggml's block structs
exactly, in the shape convention of `gguf.quants.quantize`: the last dimension of n elements
becomes n / block_size * type_size bytes (`gguf.quants.quant_shape_to_byte_shape`).

The quantizer is simple, not llama.cpp's: each sub-block gets a float scale (and for the affine
types a min) from its range, refined by trying a few narrower ranges with a least-squares refit and
keeping the best; the sub-block scales are then rounded to the super-block's 4/6/8-bit grid under
an fp16 super-block scale, and every value is rounded to the nearest level under its final scale.
All of it is vectorized over blocks; inputs are assumed to lie within fp16 range.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

# The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
KVALUES_IQ4 = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)

# Fractions of a sub-block's full range tried as its quantization range (1.0 = min/max).
_SHRINK = np.linspace(0.6, 1.0, 9, dtype=np.float32)[:, None]


def _inv(x: np.ndarray) -> np.ndarray:
    """1/x, and 0 where x is 0."""
    safe = np.where(x == 0, np.float32(1), x)
    return np.where(x == 0, np.float32(0), np.float32(1) / safe)


def _f16(x: np.ndarray) -> np.ndarray:
    """The float32 value `x` takes once stored as fp16."""
    return x.astype(np.float16).astype(np.float32)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    """(n,) floats -> (n, 2) little-endian fp16 bytes."""
    return x.astype("<f2").view(np.uint8).reshape(-1, 2)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Pack along axis -2: out[..., j] = OR over i of q[..., i, j] << (bits * i)."""
    shifts = (np.arange(q.shape[-2], dtype=np.uint8) * np.uint8(bits))[:, None]
    return np.bitwise_or.reduce(q.astype(np.uint8) << shifts, axis=-2)


def _nearest(v: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index into sorted `levels` of the level nearest to each value of `v`."""
    return np.searchsorted((levels[1:] + levels[:-1]) / 2, v)


def _fit_affine(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of x (n, L): scale >= 0 and min >= 0 with x ~ scale * q - min, q in 0..nmax."""
    lo = np.minimum(x.min(-1), 0)  # ggml's min is stored as a non-negative offset: the range includes 0
    hi = x.max(-1)
    center, half = (hi + lo) / 2, (hi - lo) / 2
    first = center - half * _SHRINK  # (C, n): lowest level of each candidate range
    step = 2 * half * _SHRINK / nmax
    q = np.clip(np.rint((x - first[..., None]) * _inv(step)[..., None]), 0, nmax)
    # Least-squares (scale, offset) for those q, with the offset kept <= 0.
    n = x.shape[-1]
    sq, sqq = q.sum(-1), (q * q).sum(-1)
    sx, sxq = x.sum(-1), (x * q).sum(-1)
    det = n * sqq - sq * sq
    scale = (n * sxq - sq * sx) * _inv(det)
    offset = (sx - scale * sq) / n
    flat = (det <= 0) | (offset > 0)  # all q equal, or the best offset is positive: fix the offset
    offset = np.where(flat, np.minimum(np.where(det <= 0, sx / n, 0), 0), offset)
    scale = np.where(flat, (sxq - offset * sq) * _inv(sqq), scale)
    scale = np.maximum(scale, 0)
    err = np.square(scale[..., None] * q + offset[..., None] - x).sum(-1)
    best = err.argmin(0)[None]
    return np.take_along_axis(scale, best, 0)[0], -np.take_along_axis(offset, best, 0)[0]


def _fit_symmetric(x: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Per row of x (n, L): a signed scale with x ~ scale * level, levels sorted with the widest
    one first (levels[0] = -levels.max() or further): the value of largest magnitude maps to it."""
    big = np.take_along_axis(x, np.abs(x).argmax(-1)[:, None], -1)[:, 0]
    scale = big / levels[0] * _SHRINK  # (C, n)
    q = levels[_nearest(x * _inv(scale)[..., None], levels)]
    sxq, sqq = (x * q).sum(-1), (q * q).sum(-1)
    best = (-sxq * sxq * _inv(sqq)).argmin(0)[None]  # residual = sum(x^2) - sxq^2 / sqq
    return np.take_along_axis(sxq * _inv(sqq), best, 0)[0]


def _grid_unsigned(s: np.ndarray, cmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Sub-block values s (n, k) >= 0 -> fp16 super-block scale d (n,) and codes 0..cmax, s ~ d * code."""
    d = _f16(s.max(-1) / cmax)
    return d, np.clip(np.rint(s * _inv(d)[:, None]), 0, cmax)


def _grid_signed(s: np.ndarray, cmin: int) -> tuple[np.ndarray, np.ndarray]:
    """Signed sub-block scales s (n, k) -> fp16 d (n,) and codes cmin..-cmin-1; the largest maps to cmin."""
    big = np.take_along_axis(s, np.abs(s).argmax(-1)[:, None], -1)[:, 0]
    d = _f16(big / cmin)
    return d, np.clip(np.rint(s * _inv(d)[:, None]), cmin, -cmin - 1)


def _affine_k(blocks: np.ndarray, sub: int, bits: int, scale_bits: int) -> tuple[np.ndarray, ...]:
    """Shared part of Q2_K / Q4_K / Q5_K: value = d * sc[j] * q - dmin * m[j] per sub-block j.
    Returns d, dmin (n,), sc, m (n, 256 / sub) codes and q (n, 256) codes, all still float."""
    n = len(blocks)
    x = blocks.reshape(n, -1, sub)
    scale, mn = _fit_affine(x.reshape(-1, sub), (1 << bits) - 1)
    d, sc = _grid_unsigned(scale.reshape(n, -1), (1 << scale_bits) - 1)
    dmin, m = _grid_unsigned(mn.reshape(n, -1), (1 << scale_bits) - 1)
    step = (d[:, None] * sc)[..., None]
    q = np.clip(np.rint((x + (dmin[:, None] * m)[..., None]) * _inv(step)), 0, (1 << bits) - 1)
    return d, dmin, sc, m, q.reshape(n, QK_K)


def _symmetric_k(blocks: np.ndarray, sub: int, levels: np.ndarray, cmin: int) -> tuple[np.ndarray, ...]:
    """Shared part of Q3_K / Q6_K / IQ4_XS: value = d * sc[j] * levels[i] per sub-block j.
    Returns d (n,), sc (n, 256 / sub) signed codes (float) and i (n, 256) level indices."""
    n = len(blocks)
    x = blocks.reshape(n, -1, sub)
    d, sc = _grid_signed(_fit_symmetric(x.reshape(-1, sub), levels).reshape(n, -1), cmin)
    idx = _nearest(x * _inv(d[:, None] * sc)[..., None], levels)
    return d, sc, idx.reshape(n, QK_K)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    # block_q2_K (84 bytes): scales[16] (byte j: low nibble = scale, high nibble = min of sub-block j
    # of 16), qs[64] (2-bit q; element 128h + 32s + p at bits 2s of qs[32h + p]), fp16 d, fp16 dmin.
    n = len(blocks)
    d, dmin, sc, m, q = _affine_k(blocks, 16, 2, 4)
    scales = sc.astype(np.uint8) | (m.astype(np.uint8) << 4)
    qs = _pack(q.reshape(n, 2, 4, 32), 2).reshape(n, 64)
    return np.concatenate([scales, qs, _f16_bytes(d), _f16_bytes(dmin)], axis=-1)


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    # block_q3_K (110 bytes): hmask[32] (bit 2 of q + 4; element 32j + p at bit j of hmask[p]),
    # qs[64] (low 2 bits of q + 4, laid out as Q2_K's qs), scales[12] (16 6-bit codes of scale + 32:
    # low nibble of code i in byte i % 8 at bit 4 * (i // 8), its high 2 bits in byte 8 + i % 4 at
    # bit 2 * (i // 4)), fp16 d. value = d * (code - 32) * q, q in -4..3, sub-blocks of 16.
    n = len(blocks)
    d, sc, idx = _symmetric_k(blocks, 16, np.arange(-4, 4, dtype=np.float32), -32)
    u = idx.astype(np.uint8)  # = q + 4
    s6 = (sc + 32).astype(np.uint8)
    hmask = _pack((u >> 2).reshape(n, 8, 32), 1)
    qs = _pack((u & 3).reshape(n, 2, 4, 32), 2).reshape(n, 64)
    scales = np.concatenate([_pack((s6 & 15).reshape(n, 2, 8), 4), _pack((s6 >> 4).reshape(n, 4, 4), 2)], -1)
    return np.concatenate([hmask, qs, scales, _f16_bytes(d)], axis=-1)


def _q4_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    # The 12 bytes of 8 6-bit scales and 8 6-bit mins shared by Q4_K and Q5_K: bytes 0-3 hold
    # scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales/mins 4-7 keep their low nibble in
    # bytes 8-11 (scale low, min high) and their top 2 bits in the top 2 bits of bytes 0-3 / 4-7.
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    return np.concatenate(
        [
            sc[:, :4] | (sc[:, 4:] >> 4) << 6,
            m[:, :4] | (m[:, 4:] >> 4) << 6,
            (sc[:, 4:] & 15) | (m[:, 4:] & 15) << 4,
        ],
        axis=-1,
    )


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    # block_q4_K (144 bytes): fp16 d, fp16 dmin, scales[12], qs[128]: sub-blocks 2g and 2g + 1 (of
    # 32) share qs[32g:32g + 32], low and high nibble. value = d * sc * q - dmin * m, q in 0..15.
    n = len(blocks)
    d, dmin, sc, m, q = _affine_k(blocks, 32, 4, 6)
    qs = _pack(q.reshape(n, 4, 2, 32), 4).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _q4_k_scales(sc, m), qs], axis=-1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    # block_q5_K (176 bytes): Q4_K's d, dmin, scales[12], then qh[32] (bit 4 of q; element 32j + p
    # at bit j of qh[p]) before qs[128] (low 4 bits, as Q4_K). q in 0..31.
    n = len(blocks)
    d, dmin, sc, m, q = _affine_k(blocks, 32, 5, 6)
    u = q.astype(np.uint8)
    qh = _pack((u >> 4).reshape(n, 8, 32), 1)
    qs = _pack((u & 15).reshape(n, 4, 2, 32), 4).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _q4_k_scales(sc, m), qh, qs], axis=-1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    # block_q6_K (210 bytes): ql[128] (low 4 bits of q + 32; element 128h + 64k + p in nibble k of
    # ql[64h + p]), qh[64] (top 2 bits; element 128h + 32s + p at bits 2s of qh[32h + p]), int8
    # scales[16] (one per 16 elements), fp16 d. value = d * scale * q, q in -32..31.
    n = len(blocks)
    d, sc, idx = _symmetric_k(blocks, 16, np.arange(-32, 32, dtype=np.float32), -128)
    u = idx.astype(np.uint8)  # = q + 32
    ql = _pack((u & 15).reshape(n, 2, 2, 64), 4).reshape(n, 128)
    qh = _pack((u >> 4).reshape(n, 2, 4, 32), 2).reshape(n, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=-1)


def _iq4_nl(blocks: np.ndarray) -> np.ndarray:
    # block_iq4_nl (18 bytes, 32 elements): fp16 d, qs[16] (4-bit indices into KVALUES_IQ4; element
    # 16k + p in nibble k of qs[p]). value = d * KVALUES_IQ4[index].
    n = len(blocks)
    d = _f16(_fit_symmetric(blocks, KVALUES_IQ4))
    idx = _nearest(blocks * _inv(d)[:, None], KVALUES_IQ4)
    return np.concatenate([_f16_bytes(d), _pack(idx.reshape(n, 2, 16), 4)], axis=-1)


def _iq4_xs(blocks: np.ndarray) -> np.ndarray:
    # block_iq4_xs (136 bytes): fp16 d, uint16 scales_h (top 2 bits of 6-bit code j at bits 2j),
    # scales_l[4] (low nibble of code j in nibble j % 2 of byte j // 2), qs[128] (sub-block j of 32
    # laid out as an IQ4_NL block in qs[16j:16j + 16]). value = d * (code - 32) * KVALUES_IQ4[index].
    n = len(blocks)
    d, sc, idx = _symmetric_k(blocks, 32, KVALUES_IQ4, -32)
    s6 = (sc + 32).astype(np.uint16)
    scales_h = np.bitwise_or.reduce((s6 >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=-1)
    scales_l = _pack((s6 & 15).reshape(n, 4, 2).swapaxes(-1, -2), 4)
    qs = _pack(idx.reshape(n, 8, 2, 16), 4).reshape(n, 128)
    h = scales_h.astype("<u2").view(np.uint8).reshape(n, 2)
    return np.concatenate([_f16_bytes(d), h, scales_l, qs], axis=-1)


_ENCODERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLQuantizationType.Q2_K: _q2_k,
    GGMLQuantizationType.Q3_K: _q3_k,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
    GGMLQuantizationType.IQ4_NL: _iq4_nl,
    GGMLQuantizationType.IQ4_XS: _iq4_xs,
}

SUPPORTED = tuple(_ENCODERS)


def quantize(rows: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Encode float data (last dimension a multiple of the type's block size) as `qtype` blocks:
    a uint8 array shaped like `gguf.quants.quantize`'s output, readable by `gguf.quants.dequantize`."""
    encoder = _ENCODERS.get(qtype)
    if encoder is None:
        raise NotImplementedError(f"no encoder for {qtype.name}")
    rows = np.asarray(rows, dtype=np.float32)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    out_shape = quant_shape_to_byte_shape(rows.shape, qtype)  # raises unless the row size fits
    blocks = encoder(rows.reshape(-1, block_size))
    assert blocks.dtype == np.uint8 and blocks.shape == (rows.size // block_size, type_size)
    return blocks.reshape(out_shape)
