"""One decode token of qwen3_5's linear-attention layer (a gated delta net) for every slot.

The layer keeps no keys and values: each row carries the last `kernel - 1` inputs of its causal
convolution and a recurrent state `[value_heads, value_dim, key_dim]`, both in the slots of the
`SlotStore` (float32 for the recurrent state, as mlx-lm keeps it). A token reads and replaces both.
The four input projections are fused into one matmul at load; the convolution, the query/key
normalization, the delta-rule update and the gated norm are the model's own code, so the math is
mlx-lm's.
"""

from __future__ import annotations

from typing import Any

from swama.engine.text.compiled_step.fusion import Fused, fusable, fuse, projection
from swama.engine.text.compiled_step.slots import State


def linear_parts(module: Any) -> list[Any]:
    return [module.in_proj_qkv, module.in_proj_z, module.in_proj_b, module.in_proj_a]


def covered(module: Any) -> bool:
    """Whether the step can take this layer: its projections plain or quantized linear layers, and
    not split across ranks."""
    return getattr(module, "sharding_group", None) is None and fusable(linear_parts(module))


class LinearStep:
    def __init__(self, module: Any) -> None:
        self.module = module
        self.inputs: Fused = fuse(linear_parts(module))
        self.out = projection(module.out_proj)

    def states(self) -> tuple[State, ...]:
        """A row's convolution window (the model's dtype) and recurrent state (float32)."""
        import mlx.core as mx

        m = self.module
        return (State((m.conv_kernel_size - 1, m.conv_dim)),
                State((m.num_v_heads, m.head_v_dim, m.head_k_dim), mx.float32))

    def __call__(self, x: Any, window: Any, state: Any) -> tuple[Any, Any, Any]:
        """The layer's output [slots, hidden] for `x` [slots, hidden], and the rows' next window and
        state."""
        import mlx.core as mx
        import mlx.nn as nn
        from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk

        m = self.module
        slots = x.shape[0]
        qkv, z, b, a = self.inputs.split(self.inputs(x))
        conv_input = mx.concatenate([window, qkv[:, None].astype(window.dtype)], axis=1)
        conv_out = nn.silu(m.conv1d(conv_input))  # [slots, 1, conv_dim]: the kernel spans the window
        q, k, v = mx.split(conv_out, [m.key_dim, 2 * m.key_dim], axis=-1)
        q = q.reshape(slots, 1, m.num_k_heads, m.head_k_dim)
        k = k.reshape(slots, 1, m.num_k_heads, m.head_k_dim)
        v = v.reshape(slots, 1, m.num_v_heads, m.head_v_dim)
        q, k = normalize_qk(q, k, inv_scale=m.head_k_dim ** -0.5, eps=1e-6)
        out, state = gated_delta_update(q, k, v, a[:, None], b[:, None], m.A_log, m.dt_bias, state, None,
                                        use_kernel=not m.training)
        out = m.norm(out, z.reshape(slots, 1, m.num_v_heads, m.head_v_dim))
        return self.out(out.reshape(slots, -1)), conv_input[:, 1:], state.astype(mx.float32)
