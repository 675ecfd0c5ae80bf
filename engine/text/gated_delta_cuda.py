"""The gated delta rule (qwen3_5's and qwen3_next's linear attention) over a whole prompt in one CUDA
kernel.

mlx-lm runs the recurrence in one fused kernel on Metal only; elsewhere it takes one step per token
in MLX operations (`gated_delta_ops`), so a prefill forward of T tokens is thousands of launches, and
every step's `[rows, heads, value_dim, key_dim]` state stays alive until the forward is evaluated:
about 1.2 MB a row-token a layer at Qwen3.5's sizes, which ran a GPU out of memory at 256 streams.
Here one warp holds one value row of one head's state (its `key_dim` spread over the lanes) in
registers for all T tokens and writes each token's output as it goes: the state lives once per row,
not once per token. The math is mlx-lm's step, in float32: decay the state by `g`, read it with the
key, correct it towards the value by `beta`, read the output with the query; a masked token leaves
the state as it was.

`install()` puts the kernel under mlx-lm's `gated_delta_ops` for the process when MLX runs on CUDA;
what the kernel does not cover (a per-key gate, a key size that is not a whole number of warps)
keeps mlx-lm's operations.
"""

from __future__ import annotations

from typing import Any

WARPS = 4  # value rows a block

_SOURCE = """
    constexpr int PER = DK / 32;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    const int hv = blockIdx.y;
    const int b = blockIdx.z;
    if (row >= DV) {
        return;
    }
    const int hk = hv / (HV / HK);
    float s[PER];
    const size_t so = (((size_t)b * HV + hv) * DV + row) * DK + lane * PER;
    for (int i = 0; i < PER; i++) {
        s[i] = static_cast<float>(state_in[so + i]);
    }
    for (int t = 0; t < T; t++) {
        const size_t gt = ((size_t)b * T + t) * HV + hv;
        const size_t qk = (((size_t)b * T + t) * HK + hk) * DK + lane * PER;
        float kv[PER];
        float old[PER];
        const float decay = static_cast<float>(g[gt]);
        float read = 0.f;
        for (int i = 0; i < PER; i++) {
            old[i] = s[i];
            kv[i] = static_cast<float>(k[qk + i]);
            s[i] *= decay;
            read += s[i] * kv[i];
        }
        for (int o = 16; o > 0; o >>= 1) {
            read += __shfl_xor_sync(0xffffffff, read, o);
        }
        const float value = static_cast<float>(v[gt * DV + row]);
        const float delta = (value - read) * static_cast<float>(beta[gt]);
        float y = 0.f;
        for (int i = 0; i < PER; i++) {
            s[i] += kv[i] * delta;
            y += s[i] * static_cast<float>(q[qk + i]);
        }
        for (int o = 16; o > 0; o >>= 1) {
            y += __shfl_xor_sync(0xffffffff, y, o);
        }
        if (lane == 0) {
            out[gt * DV + row] = static_cast<OUT_T>(y);
        }
        if (HAS_MASK && !mask[(size_t)b * T + t]) {
            for (int i = 0; i < PER; i++) {
                s[i] = old[i];
            }
        }
    }
    for (int i = 0; i < PER; i++) {
        state_out[so + i] = s[i];
    }
"""

_kernel: Any = None
_original: Any = None


def _built() -> Any:
    global _kernel
    if _kernel is None:
        import mlx.core as mx

        _kernel = mx.fast.cuda_kernel(
            name="swama_gated_delta", input_names=["q", "k", "v", "g", "beta", "state_in", "mask"],
            output_names=["out", "state_out"], source=_SOURCE.replace("WARPS", str(WARPS)))
    return _kernel


def covers(q: Any, g: Any) -> bool:
    """Whether the kernel takes these inputs: a gate per head (not per key) and whole warps of keys."""
    return g.ndim == 3 and q.shape[-1] % 32 == 0 and q.shape[-1] <= 512


def gated_delta(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any = None, mask: Any = None) -> tuple[Any, Any]:
    """mlx-lm's `gated_delta_ops` contract: q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g and beta
    [B, T, Hv], state [B, Hv, Dv, Dk] (float32; zeros when None), mask [B, T] or None. Returns the
    outputs [B, T, Hv, Dv] in q's dtype and the final state in float32."""
    import mlx.core as mx

    batch, tokens, hk, dk = q.shape
    hv, dv = v.shape[-2:]
    if state is None:
        state = mx.zeros((batch, hv, dv, dk), dtype=mx.float32)
    has_mask = mask is not None
    mask = mask.astype(mx.bool_) if has_mask else mx.zeros((1,), dtype=mx.bool_)
    out, state = _built()(
        inputs=[q, k, v, g.astype(mx.float32), beta.astype(mx.float32), state.astype(mx.float32), mask],
        template=[("OUT_T", q.dtype), ("T", tokens), ("HK", hk), ("HV", hv), ("DK", dk), ("DV", dv),
                  ("HAS_MASK", has_mask)],
        grid=(-(-dv // WARPS) * WARPS * 32, hv, batch), threadgroup=(WARPS * 32, 1, 1),
        output_shapes=[(batch, tokens, hv, dv), (batch, hv, dv, dk)], output_dtypes=[q.dtype, mx.float32])
    return out, state


def _ops(q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any = None, mask: Any = None) -> tuple[Any, Any]:
    import mlx.core as mx

    if mx.default_device() == mx.gpu and covers(q, g):
        return gated_delta(q, k, v, g, beta, state, mask)
    return _original(q, k, v, g, beta, state, mask)


def install() -> bool:
    """The kernel under mlx-lm's `gated_delta_ops`, once a process, where MLX runs on CUDA; whether
    it is in place."""
    global _original
    import mlx.core as mx
    from mlx_lm.models import gated_delta

    if _original is not None:
        return True
    if not (mx.cuda.is_available() and mx.default_device() == mx.gpu):
        return False
    _original = gated_delta.gated_delta_ops
    gated_delta.gated_delta_ops = _ops
    return True
