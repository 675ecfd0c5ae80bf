"""The gated delta rule in one CUDA kernel (engine/text/gated_delta_cuda.py) gives mlx-lm's
per-token operations' outputs and final state, with and without a mask, grouped heads and several
tokens, and keeps one state a row instead of one a token. It runs on MLX's CUDA backend only: on
the CPU `install()` leaves mlx-lm as it is."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import gated_delta as mlx_lm_gated_delta

from swama.engine.text import gated_delta_cuda

ON_CUDA = mx.cuda.is_available() and mx.default_device() == mx.gpu
cuda_only = pytest.mark.skipif(not ON_CUDA, reason="the kernel runs on MLX's CUDA backend")


def _original():  # mlx-lm's own, whether or not the kernel is installed in this process
    return gated_delta_cuda._original or mlx_lm_gated_delta.gated_delta_ops


def _inputs(batch: int, tokens: int, hk: int, hv: int, dk: int, dv: int, seed: int = 0) -> list[mx.array]:
    keys = mx.random.split(mx.random.key(seed), 6)
    q = (mx.random.normal((batch, tokens, hk, dk), key=keys[0]) * dk ** -0.5).astype(mx.bfloat16)
    k = (mx.random.normal((batch, tokens, hk, dk), key=keys[1]) * dk ** -0.5).astype(mx.bfloat16)
    v = mx.random.normal((batch, tokens, hv, dv), key=keys[2]).astype(mx.bfloat16)
    g = mx.random.uniform(0.6, 1.0, (batch, tokens, hv), key=keys[3])
    beta = mx.random.uniform(0.0, 1.0, (batch, tokens, hv), key=keys[4]).astype(mx.bfloat16)
    state = mx.random.normal((batch, hv, dv, dk), key=keys[5]) * 0.1
    return [q, k, v, g, beta, state]


def test_install_takes_cuda_only() -> None:
    assert gated_delta_cuda.install() is ON_CUDA
    assert (mlx_lm_gated_delta.gated_delta_ops is gated_delta_cuda._ops) is ON_CUDA


@cuda_only
@pytest.mark.parametrize("batch,tokens,hk,hv,dk,dv,masked", [
    (3, 1, 2, 4, 64, 32, False),  # a decode step, two value heads to each key head
    (2, 37, 2, 2, 128, 128, True),  # a prompt, left-padded rows
    (4, 16, 16, 16, 128, 128, False),  # Qwen3.5's linear layer
])
def test_the_kernel_gives_mlx_lms_outputs_and_state(batch: int, tokens: int, hk: int, hv: int, dk: int, dv: int,
                                                    masked: bool) -> None:
    q, k, v, g, beta, state = _inputs(batch, tokens, hk, hv, dk, dv)
    mask = (mx.arange(tokens)[None] >= mx.array([5 * i for i in range(batch)])[:, None]) if masked else None
    got_y, got_state = gated_delta_cuda.gated_delta(q, k, v, g, beta, state, mask)
    want_y, want_state = _original()(q, k, v, g, beta, state, mask)
    assert got_y.dtype == want_y.dtype and got_state.dtype == mx.float32
    scale = max(1.0, mx.abs(want_y.astype(mx.float32)).max().item())
    # The outputs are rounded to bfloat16: float32 values a hair apart may land a step apart, 2^-7 of the
    # largest (0.0078); 0.02 allows two and a half steps.
    assert mx.abs(got_y.astype(mx.float32) - want_y.astype(mx.float32)).max().item() <= 0.02 * scale
    # The states stay float32 on both sides, their reads summed in another order (a warp's lanes):
    # f32_reordered(1, 128 x 37 products) is 7e-5 of their size, well under this.
    assert mx.abs(got_state - want_state).max().item() <= 1e-3 * max(1.0, mx.abs(want_state).max().item())
    if masked:  # a row masked throughout the prompt keeps its state as it came in
        assert mx.array_equal(got_state[0], state[0]).item() is False  # row 0 is never masked
        fully = _inputs(1, 4, hk, hv, dk, dv, seed=1)
        _, kept = gated_delta_cuda.gated_delta(*fully[:5], fully[5], mx.zeros((1, 4), dtype=mx.bool_))
        assert mx.array_equal(kept, fully[5]).item()


@cuda_only
def test_the_kernel_keeps_one_state_a_row_not_one_a_token() -> None:
    inputs = _inputs(16, 128, 16, 16, 128, 128)
    mx.eval(inputs)
    peaks = []
    for fn in (gated_delta_cuda.gated_delta, _original()):
        mx.synchronize()
        mx.clear_cache()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        mx.eval(fn(*inputs))
        peaks.append(mx.get_peak_memory() - base)
    kernel, ops = peaks
    assert kernel < 64 * 2**20, f"the kernel's forward peaked {kernel / 2**20:.0f} MiB over its inputs"
    assert kernel * 10 < ops
