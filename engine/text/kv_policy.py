"""What --kv-bits means for one model, without MLX: the quantization settings (`KVQuant`) and whether a
model's heads take them (MLX quantizes in groups of 32, 64 or 128 values along a head).

The catalog (/v1/models) reads this for every installed model from its config; the engine applies
it to each loaded model (engine/text/kv_quant.py)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("swama.engine")

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class KVQuant:
    """How a model's key/value caches are quantized: one per server (settings kv_bits, kv_group_size,
    kv_quantize_after)."""

    bits: int
    group_size: int = 32
    after: int = 0  # tokens a cache holds before it is quantized

    def due(self, tokens: int) -> bool:
        return tokens >= self.after

    def element_bytes(self, dtype_bytes: int) -> float:
        """Bytes one key or value element takes: its bits, plus a scale and a bias per group."""
        return self.bits / 8 + 2 * dtype_bytes / self.group_size

    def fits(self, head_dim: int) -> str | None:
        """None when heads of `head_dim` values quantize in groups of `group_size`; else why not."""
        if head_dim % self.group_size == 0:
            return None
        sizes = [str(g) for g in GROUP_SIZES if head_dim % g == 0]
        fix = f"--kv-group-size {' or '.join(sizes)} would" if sizes else "no group size MLX offers can"
        return f"--kv-group-size {self.group_size} does not divide its head size ({head_dim}); {fix}"

    def describe(self) -> dict[str, int]:
        return {"bits": self.bits, "group_size": self.group_size, "quantize_after": self.after}




def quantized(cache: object) -> bool:
    """Whether a layer cache holds quantized keys and values (mlx-lm's attention picks its quantized
    path by the same attribute)."""
    return hasattr(cache, "bits")


def config_head_dim(model_path: Path) -> int | None:
    """A model's attention head size from its config.json, where it says so plainly."""
    try:
        config = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)
    if config.get("head_dim"):
        return int(config["head_dim"])
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    return hidden // heads if heads and hidden else None


def in_force(kv: KVQuant | None, model_path: Path, name: str = "") -> KVQuant | None:
    """The quantization a model's caches get: `kv`, or None (full precision) where its heads cannot
    be grouped as `kv` says (logged once the model loads, given its `name`)."""
    if kv is None:
        return None
    dim = config_head_dim(model_path)  # the config's: a split model's modules hold a share of the heads
    why = kv.fits(dim) if dim else None
    if why is None:
        return kv
    if name:
        log.warning("%s keeps full-precision key/value caches: %s", name, why)
    return None


def use_kv_quant(model: Any, kv: KVQuant | None) -> None:
    """Quantize a loaded language model's caches as `kv` says (None: full precision): kept beside the
    model, where the scheduler, the prompt cache and generation alone read it (`kv_quant_of`)."""
    model.beside.set(KVQuant, in_force(kv, model.path, name=model.id))


def kv_quant_of(model: Any) -> KVQuant | None:
    """The quantization in force for a loaded model's caches (None: full precision)."""
    return model.beside.get(KVQuant)


def catalog_entry(kv: KVQuant | None, model_path: Path) -> dict[str, int | None]:
    """What /v1/models says of a language model's cache: the quantization in force, nulls for none."""
    used = in_force(kv, model_path)
    return used.describe() if used is not None else {"bits": None, "group_size": None, "quantize_after": None}
