"""One decode token's attention over each row's own span of the slots, in one CUDA kernel.

MLX's fused attention for a single query (its `sdpa_vector` kernel on CUDA) takes no mask, so a
batch whose rows hold different lengths falls back to five operations a layer (scale, scores,
mask, softmax, weighted sum), each a launch, and reads every slot's whole capacity. This kernel
takes each row's `start` and `end` instead of a mask and reads only those positions: one block per
(row, query head), its warps taking every fourth position with an online softmax each, combined at
the end. Grouped-query heads read their key/value head. Elsewhere (the CPU, Metal) `attend` is
MLX's own attention with the equivalent mask.
"""

from __future__ import annotations

from typing import Any

WARPS = 4

_SOURCE = """
    constexpr int PER = D / 32;
    const float NEG_INF = __int_as_float(0xff800000);
    const int b = blockIdx.y;
    const int h = blockIdx.x;
    const int kvh = h / (HQ / HKV);
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int first = starts[b];
    const int last = ends[b];
    const float sc = scale[0];
    float qv[PER];
    float acc[PER];
    const size_t qo = ((size_t)b * HQ + h) * D + lane * PER;
    for (int i = 0; i < PER; i++) {
        qv[i] = static_cast<float>(q[qo + i]) * sc;
        acc[i] = 0.f;
    }
    float m = NEG_INF;
    float l = 0.f;
    const size_t base = ((size_t)b * HKV + kvh) * (size_t)C * D + lane * PER;
    for (int p = first + warp; p <= last; p += WARPS) {
        const size_t at = base + (size_t)p * D;
        float s = 0.f;
        for (int i = 0; i < PER; i++) {
            s += qv[i] * static_cast<float>(keys[at + i]);
        }
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(0xffffffff, s, o);
        }
        const float mn = fmaxf(m, s);
        const float corr = __expf(m - mn);
        const float w = __expf(s - mn);
        for (int i = 0; i < PER; i++) {
            acc[i] = acc[i] * corr + w * static_cast<float>(values[at + i]);
        }
        l = l * corr + w;
        m = mn;
    }
    __shared__ float sm[WARPS];
    __shared__ float sl[WARPS];
    __shared__ float so[WARPS][D];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    for (int i = 0; i < PER; i++) {
        so[warp][lane * PER + i] = acc[i];
    }
    __syncthreads();
    if (warp == 0) {
        float top = NEG_INF;
        for (int w = 0; w < WARPS; w++) {
            top = fmaxf(top, sm[w]);
        }
        float total = 0.f;
        float r[PER];
        for (int i = 0; i < PER; i++) {
            r[i] = 0.f;
        }
        for (int w = 0; w < WARPS; w++) {
            const float f = sm[w] == NEG_INF ? 0.f : __expf(sm[w] - top);
            total += f * sl[w];
            for (int i = 0; i < PER; i++) {
                r[i] += f * so[w][lane * PER + i];
            }
        }
        for (int i = 0; i < PER; i++) {
            out[qo + i] = static_cast<T>(r[i] / total);
        }
    }
"""

_kernel: Any = None


def kernel_available(head_dim: int) -> bool:
    """Whether this process runs the kernel: MLX's CUDA backend, and a head size of whole warps."""
    import mlx.core as mx

    return head_dim % 32 == 0 and mx.default_device() == mx.gpu and mx.cuda.is_available()


def _built() -> Any:
    global _kernel
    if _kernel is None:
        import mlx.core as mx

        _kernel = mx.fast.cuda_kernel(
            name="swama_span_attention", input_names=["q", "keys", "values", "starts", "ends", "scale"],
            output_names=["out"], source=_SOURCE.replace("WARPS", str(WARPS)))
    return _kernel


def span_attention(q: Any, keys: Any, values: Any, starts: Any, ends: Any, scale: Any) -> Any:
    """q [slots, heads, 1, dim] against keys/values [slots, kv_heads, capacity, dim] at positions
    starts[b] .. ends[b] of each row b; `scale` a float32 array of one value."""
    slots, heads, _, dim = q.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    return _built()(
        inputs=[q, keys, values, starts, ends, scale],
        template=[("T", q.dtype), ("D", dim), ("HQ", heads), ("HKV", kv_heads), ("C", capacity)],
        grid=(heads * 32 * WARPS, slots, 1), threadgroup=(32 * WARPS, 1, 1),
        output_shapes=[q.shape], output_dtypes=[q.dtype])[0]


def masked_attention(q: Any, keys: Any, values: Any, starts: Any, ends: Any, scale: float) -> Any:
    """The same with MLX's own attention and a mask of each row's span."""
    import mlx.core as mx

    span = mx.arange(keys.shape[2])[None]
    mask = ((span >= starts[:, None]) & (span <= ends[:, None]))[:, None, None, :]
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)


def kernel_agrees(heads: int, kv_heads: int, dim: int, dtype: Any) -> str | None:
    """Build the kernel for this shape and check it against `masked_attention` on random rows of
    different spans; None when it agrees, else why not (a build or launch error, or the difference)."""
    import mlx.core as mx

    try:
        key = mx.random.key(0)
        q, k, v = (mx.random.normal(shape, key=mx.random.split(key, 3)[i]).astype(dtype)
                   for i, shape in enumerate([(3, heads, 1, dim), (3, kv_heads, 64, dim), (3, kv_heads, 64, dim)]))
        starts, ends = mx.array([0, 5, 17], dtype=mx.int32), mx.array([63, 20, 17], dtype=mx.int32)
        scale = dim ** -0.5
        got = span_attention(q, k, v, starts, ends, mx.array([scale], dtype=mx.float32))
        want = masked_attention(q, k, v, starts, ends, scale)
        worst = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
    except Exception as exc:  # a failed NVRTC build or launch: the masked path serves instead
        return f"{type(exc).__name__}: {exc}"
    return None if worst <= 0.05 else f"it differs from MLX's attention by {worst}"
