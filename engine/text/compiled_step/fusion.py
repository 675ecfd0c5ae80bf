"""Projections that read the same input fused into one matmul, done once at load.

A layer's query, key and value projections become one matrix, and the MLP's gate and up projections
another: one launch where there were three or two. The model's own modules keep working for every
other path (prefill, decisions, mlx-lm's forward): each one's weight becomes a row slice of the
fused matrix, which MLX keeps as a view of the fused buffer, so no weight is held twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_QUANTIZED_PARTS = ("weight", "scales", "biases", "bias")
_DENSE_PARTS = ("weight", "bias")


@dataclass(frozen=True)
class Fused:
    """Several projections of one input as one: `sizes` their output widths, in order."""

    params: dict[str, Any]
    sizes: tuple[int, ...]
    quantized: dict[str, Any] | None = None  # group_size, bits, mode of a quantized matrix

    def __call__(self, x: Any) -> Any:
        import mlx.core as mx

        p = self.params
        if self.quantized is None:
            out = x @ p["weight_t"]
        else:
            out = mx.quantized_matmul(x, p["weight"], p["scales"], p.get("biases"), transpose=True, **self.quantized)
        return out + p["bias"] if "bias" in p else out

    def split(self, out: Any) -> list[Any]:
        import mlx.core as mx

        cuts, at = [], 0
        for size in self.sizes[:-1]:
            at += size
            cuts.append(at)
        return mx.split(out, cuts, axis=-1)


def _kind(module: Any) -> tuple[Any, ...] | None:
    """What must agree for modules to fuse; None for a module that cannot (LoRA, sharded, ...)."""
    import mlx.nn as nn

    if type(module) is nn.Linear:
        return ("dense", "bias" in module)
    if type(module) is nn.QuantizedLinear:
        return ("quantized", module.group_size, module.bits, getattr(module, "mode", "affine"),
                "bias" in module, module.get("biases") is not None)
    return None


def fusable(modules: list[Any]) -> bool:
    kinds = [_kind(m) for m in modules]
    return kinds[0] is not None and all(k == kinds[0] for k in kinds)


def fuse(modules: list[Any]) -> Fused:
    """One matrix for `modules` (as `fusable` allows), their own weights now views of it."""
    import mlx.core as mx
    import mlx.nn as nn

    quantized = type(modules[0]) is nn.QuantizedLinear
    names = [n for n in (_QUANTIZED_PARTS if quantized else _DENSE_PARTS) if modules[0].get(n) is not None]
    sizes = tuple(int(m["weight"].shape[0]) for m in modules)
    if len(modules) == 1:
        params = {n: modules[0][n] for n in names}
    else:
        params = {n: mx.concatenate([m[n] for m in modules], axis=0) for n in names}
        mx.eval(params)
        at = 0
        for module, size in zip(modules, sizes, strict=True):
            for n in names:
                module[n] = params[n][at:at + size]
            at += size
        mx.eval([m.parameters() for m in modules])
    return _made(params, sizes, modules[0] if quantized else None)


def _made(params: dict[str, Any], sizes: tuple[int, ...], quantized: Any) -> Fused:
    """A `Fused` whose dense weight is also held transposed (a view, evaluated once: the traced step
    then has no transpose of its own to replay)."""
    import mlx.core as mx

    options = None
    if quantized is not None:
        options = {"group_size": quantized.group_size, "bits": quantized.bits}
        if hasattr(quantized, "mode"):
            options["mode"] = quantized.mode
    else:
        params = {**params, "weight_t": params["weight"].T}
        mx.eval(params["weight_t"])
    return Fused(params, sizes, options)


def projection(module: Any) -> Fused | Any:
    """A module the step calls as a projection: a linear layer as a `Fused` of one, an embedding
    table as the output head it is when tied; any other module as it is."""
    import mlx.nn as nn

    if _kind(module) is not None:
        return fuse([module])
    if type(module) is nn.Embedding:
        return _made({"weight": module.weight}, (int(module.weight.shape[0]),), None)
    if type(module) is nn.QuantizedEmbedding:
        params = {n: module[n] for n in ("weight", "scales", "biases") if module.get(n) is not None}
        return _made(params, (int(module.weight.shape[0]),), module)
    return module
