"""The quantized batch cache against mlx-lm's plain one. MLX quantizes each position's head vector
by itself (groups run along the last axis), so every operation on a quantized batch (merge, growing,
chunked prefill with right padding rolled out, filter, extend, extract) must hold exactly the
quantization of what the same operations leave in a plain `BatchKVCache`."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import BatchKVCache, KVCache
from precision import f32_reordered

from swama.engine.text.kv_cache import BatchQuantizedKVCache, QuantizedRow
from swama.engine.text.kv_policy import KVQuant
from swama.engine.text.kv_quant import as_quantized

HEADS, DIM = 2, 64


def row(n: int, seed: int) -> KVCache:
    cache = KVCache()
    if n:
        k, v = (mx.random.normal((1, HEADS, n, DIM), key=mx.random.key(seed + i)) for i in (0, 1000))
        cache.update_and_fetch(k, v)
    return cache


def same_rows(plain: BatchKVCache, quant: BatchQuantizedKVCache, kv: KVQuant) -> None:
    """Every row of `quant` is exactly the quantization of that row of `plain`."""
    mx.eval(plain.left_padding)
    assert plain.offset.tolist() == quant.offset.tolist() and plain._idx == quant._idx
    for i in range(plain.offset.shape[0]):
        want, got = QuantizedRow.of(plain.extract(i), kv), quant.extract(i)
        assert got.offset == want.offset
        if want.offset:
            for a, b in zip((*want.keys, *want.values), (*got.keys, *got.values), strict=True):
                assert a.shape == b.shape and mx.array_equal(a, b).item()


@pytest.mark.parametrize("bits", [4, 8])
def test_every_batch_operation_matches_the_plain_cache(bits: int) -> None:
    kv = KVQuant(bits, 64)
    rows = [row(n, s) for s, n in enumerate([5, 0, 300, 17])]
    plain = BatchKVCache.merge(rows)
    quant = BatchQuantizedKVCache.merge(as_quantized(rows, kv, force=True))
    same_rows(plain, quant, kv)

    # A chunked prefill with right padding (rows of different chunk lengths), past a 256-token step.
    lengths = [3, 260, 1, 40]
    width = max(lengths)
    k, v = (mx.random.normal((4, HEADS, width, DIM), key=mx.random.key(s)) for s in (7, 8))
    for c in (plain, quant):
        c.prepare(lengths=lengths, right_padding=[width - n for n in lengths])
        c.update_and_fetch(k, v)
        c.finalize()
    same_rows(plain, quant, kv)

    for step in range(3):  # decode steps
        k, v = (mx.random.normal((4, HEADS, 1, DIM), key=mx.random.key(20 + step + s)) for s in (0, 50))
        plain.update_and_fetch(k, v)
        quant.update_and_fetch(k, v)
    same_rows(plain, quant, kv)

    for c in (plain, quant):
        c.filter([0, 3])  # the long row leaves: the padding before the others shrinks
    same_rows(plain, quant, kv)

    other_rows = [row(n, 40 + s) for s, n in enumerate([2, 90])]
    other_plain = BatchKVCache.merge(other_rows)
    plain.extend(other_plain)
    quant.extend(BatchKVCache.merge(other_rows))  # a plain batch joins a quantized one: quantized with it
    same_rows(plain, quant, kv)
    assert quant.nbytes < plain.nbytes


def test_attention_reads_the_quantized_batch_close_to_the_plain_one() -> None:
    rows = [row(n, s) for s, n in enumerate([30, 12])]
    plain = BatchKVCache.merge(rows)
    results = {}
    for bits in (8, 4):
        quant = BatchQuantizedKVCache.merge(as_quantized(rows, KVQuant(bits), force=True))
        q = mx.random.normal((2, HEADS * 3, 1, DIM), key=mx.random.key(99))
        k, v = (mx.random.normal((2, HEADS, 1, DIM), key=mx.random.key(s)) for s in (5, 6))
        mask = plain.make_mask(1, return_array=True)  # made before the step writes, as the models do
        ref_k, ref_v = BatchKVCache.merge(rows).update_and_fetch(k, v)
        ref = scaled_dot_product_attention(q, ref_k, ref_v, cache=plain, scale=DIM ** -0.5, mask=mask)
        mask = quant.make_mask(1, return_array=True)
        got_k, got_v = quant.update_and_fetch(k, v)
        got = scaled_dot_product_attention(q, got_k, got_v, cache=quant, scale=DIM ** -0.5, mask=mask)
        results[bits] = mx.abs(got - ref).max().item()
    # Groups of 64 normal values span about 5: 8 bits (255 steps) leave each value within 0.01, and the
    # output averages them (measured 0.009); 4 bits (15 steps) make the steps 17 times larger (measured
    # 0.12), still under one such step (0.32).
    assert results[8] < 0.02 < results[4] < 0.3, results


def test_the_threshold_and_what_stays_plain() -> None:
    kv = KVQuant(8, 64, after=100)
    short, long = row(50, 1), row(150, 2)
    assert as_quantized([short], kv)[0] is short  # under the threshold: full precision
    assert isinstance(as_quantized([long], kv)[0], QuantizedRow)
    assert as_quantized([short], None)[0] is short
    assert "--kv-group-size 32 or 64 would" in KVQuant(8, 128).fits(64)
    assert "no group size" in KVQuant(8, 32).fits(16) and KVQuant(8, 64).fits(128) is None
    assert KVQuant(8, 64).element_bytes(4) == 1.125  # sums of powers of two: exact
    assert KVQuant(4, 64).element_bytes(2) == 0.5625


def test_the_cpu_attention_reads_a_quantized_chunk_as_mlx_lm_does() -> None:
    """A prompt's chunk over a quantized cache goes through the CPU's blocked attention on the same
    values dequantized (engine/text/cpu_forward.py): it matches mlx-lm's quantized attention."""
    from swama.engine.text.cpu_forward import attention

    rows = [row(n, s) for s, n in enumerate([200, 130])]
    quant = BatchQuantizedKVCache.merge(as_quantized(rows, KVQuant(8), force=True))
    q = mx.random.normal((2, HEADS * 3, 64, DIM), key=mx.random.key(3))
    k, v = (mx.random.normal((2, HEADS, 64, DIM), key=mx.random.key(s)) for s in (4, 5))
    mask = quant.make_mask(64, return_array=True)
    keys, values = quant.update_and_fetch(k, v)
    ours = attention(q, keys, values, quant, DIM ** -0.5, mask)
    reference = scaled_dot_product_attention(q, keys, values, cache=quant, scale=DIM ** -0.5, mask=mask)
    # The same dequantized values summed in another order: outputs average values under 5, over DIM and
    # up to 264 keys.
    assert mx.allclose(ours, reference, rtol=0, atol=f32_reordered(5, DIM + 264)).item()
