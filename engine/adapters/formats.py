"""LoRA adapter folders as published, read into one form: per module of the base model (its path in
mlx-lm's module tree, e.g. `model.layers.3.self_attn.q_proj`), `a` [in, rank] and `b` [rank, out]
with the adapter's scale folded into `b`, so a module's output gains `(x @ a) @ b`.

- mlx-lm's (`mlx_lm.lora` writes it): `adapter_config.json` (`fine_tune_type`, `lora_parameters` with
  `rank` and `scale`) and `adapters.safetensors` (`{module}.lora_a` [in, rank], `{module}.lora_b`
  [rank, out]); the product is scaled by `scale`.
- PEFT's: `adapter_config.json` (`r`, `lora_alpha`, `use_rslora`, `target_modules`) and
  `adapter_model.safetensors` (`base_model.model.{module}.lora_A.weight` [rank, in],
  `.lora_B.weight` [out, rank]); the product is scaled by alpha / rank (alpha / sqrt(rank) with rsLoRA).

swama installs either as its own folder (`ADAPTER_FILE`, `ADAPTER_CONFIG`: the base, rank and modules),
which is what the engine loads.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swama.engine.errors import StoreError

ADAPTER_FILE = "adapter.safetensors"  # swama's: {module}.a, {module}.b (scale folded in)
ADAPTER_CONFIG = "adapter.json"  # swama's: base, rank, modules, source format
MLX_FILES = ("adapter_config.json", "adapters.safetensors")
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


class AdapterFormatError(StoreError):
    """An adapter folder that cannot be read as a LoRA adapter (the message says why)."""


@dataclass
class AdapterWeights:
    rank: int
    source_format: str  # "mlx-lm" or "peft"
    modules: dict[str, tuple[Any, Any]]  # module path: (a [in, rank], b [rank, out]), scale folded into b

    def shapes(self) -> dict[str, tuple[int, int]]:
        """Each module's (in, out) as the adapter has it."""
        return {name: (a.shape[0], b.shape[1]) for name, (a, b) in self.modules.items()}


def adapter_format(folder: Path) -> str | None:
    """"mlx-lm", "peft", "swama" (installed), or None when the folder holds none of them."""
    if (folder / ADAPTER_FILE).is_file() and (folder / ADAPTER_CONFIG).is_file():
        return "swama"
    if all((folder / f).is_file() for f in MLX_FILES):
        return "mlx-lm"
    if all((folder / f).is_file() for f in PEFT_FILES):
        return "peft"
    return None


def _config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterFormatError(f"{folder}/adapter_config.json cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterFormatError(f"{folder}/adapter_config.json is not a JSON object.")
    return config


def _load(path: Path) -> dict[str, Any]:
    import mlx.core as mx

    try:
        return mx.load(str(path))
    except Exception as exc:  # MLX raises RuntimeError or ValueError for a damaged file
        raise AdapterFormatError(f"{path} cannot be read as safetensors: {exc}") from None


def _number(config: dict[str, Any], key: str, where: str) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise AdapterFormatError(f"{where}: '{key}' must be a positive number, not {value!r}.")
    return float(value)


def _read_mlx(folder: Path) -> AdapterWeights:
    config = _config(folder)
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise AdapterFormatError(f"{folder} is a '{kind}' fine-tune; only LoRA adapters (fine_tune_type 'lora') "
                                 "are served as adapters. Fuse it into the model instead (mlx_lm.fuse).")
    params = config.get("lora_parameters")
    if not isinstance(params, dict):
        raise AdapterFormatError(f"{folder}/adapter_config.json has no 'lora_parameters'.")
    scale = _number(params, "scale", "lora_parameters")
    weights = _load(folder / "adapters.safetensors")
    modules: dict[str, tuple[Any, Any]] = {}
    for key, a in weights.items():
        if not key.endswith(".lora_a"):
            continue
        name = key[: -len(".lora_a")]
        b = weights.get(name + ".lora_b")
        if b is None:
            raise AdapterFormatError(f"{folder}/adapters.safetensors has {key} but no {name}.lora_b.")
        modules[name] = (a, b * scale)
    return _checked(folder, modules, "mlx-lm")


def _read_peft(folder: Path) -> AdapterWeights:
    config = _config(folder)
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterFormatError(f"{folder} is a PEFT '{config.get('peft_type')}' adapter; only LoRA is served.")
    rank = _number(config, "r", "adapter_config.json")
    alpha = _number(config, "lora_alpha", "adapter_config.json")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights = _load(folder / "adapter_model.safetensors")
    modules: dict[str, tuple[Any, Any]] = {}
    for key, a in weights.items():
        if not key.endswith(".lora_A.weight"):
            continue
        name = key[: -len(".lora_A.weight")].removeprefix("base_model.model.")
        b = weights.get(key.replace(".lora_A.weight", ".lora_B.weight"))
        if b is None:
            raise AdapterFormatError(f"{folder}/adapter_model.safetensors has {key} but no lora_B beside it.")
        modules[name] = (a.T, b.T * scale)
    return _checked(folder, modules, "peft")


def _checked(folder: Path, modules: dict[str, tuple[Any, Any]], source_format: str) -> AdapterWeights:
    if not modules:
        raise AdapterFormatError(f"{folder} holds no LoRA weights.")
    ranks = set()
    for name, (a, b) in modules.items():
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise AdapterFormatError(f"{folder}: {name}'s low-rank matrices do not chain "
                                     f"({list(a.shape)} then {list(b.shape)}).")
        ranks.add(a.shape[1])
    return AdapterWeights(max(ranks), source_format, modules)


def read_adapter(folder: Path) -> AdapterWeights:
    """The adapter in `folder`, in any of the forms above; AdapterFormatError when it is none of them."""
    kind = adapter_format(folder)
    if kind == "swama":
        weights = _load(folder / ADAPTER_FILE)
        names = {k.rsplit(".", 1)[0] for k in weights}
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        return AdapterWeights(int(config["rank"]), str(config.get("source_format", "")),
                              {n: (weights[n + ".a"], weights[n + ".b"]) for n in sorted(names)})
    if kind == "mlx-lm":
        return _read_mlx(folder)
    if kind == "peft":
        return _read_peft(folder)
    raise AdapterFormatError(
        f"{folder} is not a LoRA adapter folder: expected mlx-lm's ({' and '.join(MLX_FILES)}) or PEFT's "
        f"({' and '.join(PEFT_FILES)}).")


def write_adapter(folder: Path, adapter: AdapterWeights, base: str) -> None:
    """Install `adapter` into `folder` in swama's form, recording its base model."""
    import mlx.core as mx

    arrays = {}
    for name, (a, b) in adapter.modules.items():
        arrays[name + ".a"], arrays[name + ".b"] = a, b
    mx.save_safetensors(str(folder / ADAPTER_FILE), arrays)
    config = {"base": base, "rank": adapter.rank, "source_format": adapter.source_format,
              "modules": sorted(adapter.modules)}
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
