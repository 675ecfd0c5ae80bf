"""The CPU forward path (engine/text/cpu_forward.py) gives MLX's own results to float32 rounding."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import activations, base
from mlx_lm.models.base import create_causal_mask
from precision import F32_MARGIN, F32_UNIT, f32_reordered, forward_products

from swama.engine.text import cpu_forward

# MLX's kernels and these sum in another order (blocks, the division after the values) and exponentiate
# through `power`: float32 rounding apart. Attention: outputs average values of normal samples (under 4),
# summed over d = 32 and up to 1,040 keys.
ATTENTION = f32_reordered(4, 32 + 1040)
# SwiGLU: elementwise, no sums: a few roundings (F32_MARGIN allowed) of outputs under 64 (measured 55).
SWIGLU = F32_MARGIN * F32_UNIT * 64
# The small llama below (2 layers, H 64, I 128, heads of 16) over 300 tokens: logits under 8 (measured 6.4).
FORWARD = f32_reordered(8, forward_products(2, 64, 128, 16, 300))


def _qkv(batch: int, heads: int, kv_heads: int, length: int, keys: int, dim: int = 32, seed: int = 0):
    mx.random.seed(seed)
    return (mx.random.normal((batch, heads, length, dim)), mx.random.normal((batch, kv_heads, keys, dim)),
            mx.random.normal((batch, kv_heads, keys, dim)))


def _close(a: mx.array, b: mx.array, bound: float = ATTENTION) -> None:
    assert a.shape == b.shape
    assert float(mx.abs(a - b).max()) < bound


@pytest.mark.parametrize(("batch", "heads", "kv_heads", "length", "keys"), [
    (1, 9, 3, 300, 300),    # a first prompt chunk: several blocks, grouped queries
    (1, 4, 4, 200, 712),    # a later chunk after 512 cached tokens
    (3, 6, 2, 40, 1040),    # decision suffixes over a shared prefix: rows spread over the streams
    (1, 2, 1, 129, 129),    # a last block of one row
])
def test_causal_attention_matches_mlx(batch, heads, kv_heads, length, keys):
    q, k, v = _qkv(batch, heads, kv_heads, length, keys)
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.17, mask="causal")
    _close(cpu_forward.attention(q, k, v, None, 0.17, "causal"), expected)


def test_array_masks_match_mlx():
    """Left-padded rows of a batch (boolean masks, as mlx-lm's batch caches make) and additive masks."""
    q, k, v = _qkv(4, 8, 2, 150, 400, seed=1)
    boolean = create_causal_mask(150, offset=250, left_padding=mx.array([0, 7, 30, 3]))
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=boolean)
    _close(cpu_forward.attention(q, k, v, None, 0.2, boolean), expected)
    square = create_causal_mask(150, offset=250)  # [queries, keys], as some models pass it
    _close(cpu_forward.attention(q, k, v, None, 0.2, square),
           mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=square))
    additive = mx.where(create_causal_mask(150, offset=250), 0.0, -1e9)[None, None]
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=additive)
    _close(cpu_forward.attention(q, k, v, None, 0.2, additive), expected)


def test_no_mask_and_small_problems():
    q, k, v = _qkv(2, 4, 4, 100, 100, seed=2)
    _close(cpu_forward.attention(q, k, v, None, 0.3, None),
           mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3))
    q, k, v = _qkv(16, 8, 2, 1, 2000, seed=3)  # a decode step of 16 rows: MLX's own kernel, bit for bit
    assert mx.array_equal(cpu_forward.attention(q, k, v, None, 0.3, None),
                          mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3))


def test_swiglu_matches_mlx():
    mx.random.seed(4)
    gate, x = mx.random.normal((3, 160, 256)) * 6, mx.random.normal((3, 160, 256))  # a prompt's: through power
    assert gate.size >= cpu_forward.MIN_ELEMENTS
    _close(cpu_forward.swiglu(gate, x), activations.swiglu(gate, x), SWIGLU)
    small = gate[:1, :1]  # a decode step's: mlx-lm's compiled kernel, bit for bit
    assert mx.array_equal(cpu_forward.swiglu(small, x[:1, :1]), activations.swiglu(small, x[:1, :1]))


def test_install_swaps_the_module_functions_once(tmp_path):
    from mlx_lm.models import llama

    saved = llama.scaled_dot_product_attention, llama.swiglu
    try:
        llama.scaled_dot_product_attention, llama.swiglu = base.scaled_dot_product_attention, activations.swiglu
        args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                               num_attention_heads=4, rms_norm_eps=1e-5, vocab_size=50, num_key_value_heads=2)
        model = llama.Model(args)
        assert cpu_forward.install(model) and cpu_forward.install(model)
        assert llama.scaled_dot_product_attention is cpu_forward.attention
        assert llama.swiglu is cpu_forward.swiglu
        assert not cpu_forward.install(object())  # not an mlx-lm model: left alone
    finally:
        llama.scaled_dot_product_attention, llama.swiglu = saved


def test_a_whole_model_forward_matches(tmp_path):
    """A small llama's 300-token prefill, chunked as the server reads prompts, with and without."""
    from mlx_lm.models import llama
    from mlx_lm.models.cache import make_prompt_cache

    saved = llama.scaled_dot_product_attention, llama.swiglu
    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, rms_norm_eps=1e-5, vocab_size=100, num_key_value_heads=2)
    mx.random.seed(5)
    model = llama.Model(args)
    tokens = mx.random.randint(0, 100, (1, 300))

    def run() -> mx.array:
        cache = make_prompt_cache(model)
        model(tokens[:, :170], cache=cache)
        return model(tokens[:, 170:], cache=cache)

    try:
        llama.scaled_dot_product_attention, llama.swiglu = base.scaled_dot_product_attention, activations.swiglu
        expected = run()
        cpu_forward.install(model)
        _close(run(), expected, FORWARD)
    finally:
        llama.scaled_dot_product_attention, llama.swiglu = saved
