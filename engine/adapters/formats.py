"""LoRA adapter folders as published, read into one form: per module of the base model (its path in
mlx-lm's module tree, e.g. `model.layers.3.self_attn.q_proj`), `a` [in, rank] and `b` [rank, out]
with the adapter's scale folded into `b`, so a module's output gains `(x @ a) @ b`.

- mlx-lm's (`mlx_lm.lora` writes it): `adapter_config.json` (`fine_tune_type`, `lora_parameters` with
  `rank` and `scale`) and `adapters.safetensors` (`{module}.lora_a` [in, rank], `{module}.lora_b`
  [rank, out]); the product is scaled by `scale`.
- PEFT's: `adapter_config.json` (`r`, `lora_alpha`, `use_rslora`, `target_modules`) and
  `adapter_model.safetensors` (`base_model.model.{module}.lora_A.weight` [rank, in],
  `.lora_B.weight` [out, rank]); the product is scaled by alpha / rank (alpha / sqrt(rank) with rsLoRA).
- llama.cpp's (`convert_lora_to_gguf.py` writes it): one GGUF file, `general.type` "adapter",
  `adapter.type` "lora", `adapter.lora.alpha`, and per base tensor `{gguf name}.lora_a` [rank, in] and
  `.lora_b` [out, rank] in any type the gguf package decodes; scaled by alpha / rank (1 when alpha is
  0, as llama.cpp does). Names are llama.cpp's (`blk.3.attn_q.weight`), and llama models' Q/K rows
  are in llama.cpp's rope order, both undone as the GGUF model importer undoes them.

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
    source_format: str  # "mlx-lm", "peft" or "gguf"
    modules: dict[str, tuple[Any, Any]]  # module path: (a [in, rank], b [rank, out]), scale folded into b

    def shapes(self) -> dict[str, tuple[int, int]]:
        """Each module's (in, out) as the adapter has it."""
        return {name: (a.shape[0], b.shape[1]) for name, (a, b) in self.modules.items()}


def adapter_format(folder: Path) -> str | None:
    """"mlx-lm", "peft", "swama" (installed), "gguf" (a file), or None when it is none of them."""
    if folder.is_file():
        return "gguf" if folder.suffix.lower() == ".gguf" else None
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


def _gguf_heads(metadata: dict[str, Any], base_config: dict[str, Any]) -> tuple[int | None, int | None]:
    """Query and key/value head counts, to undo the Q/K row order: the file's (the converter writes
    the base's hyperparameters beside the adapter), else the base model's config.json."""
    arch = metadata.get("general.architecture")
    counts = []
    for key, base_key in (("head_count", "num_attention_heads"), ("head_count_kv", "num_key_value_heads")):
        mine, base = metadata.get(f"{arch}.attention.{key}"), base_config.get(base_key)
        if mine is not None and base is not None and mine != base:
            raise AdapterFormatError(f"The GGUF adapter was converted against a model with {arch}.attention.{key} "
                                     f"{mine}, but the base has {base_key} {base}; it was trained for another "
                                     "base model.")
        counts.append(mine if mine is not None else base)
    heads, kv_heads = counts
    return heads, kv_heads if kv_heads is not None else heads


def _read_gguf(path: Path, base_config: dict[str, Any]) -> AdapterWeights:
    import mlx.core as mx
    import numpy as np

    from swama.engine.errors import GGUFImportError
    from swama.engine.files.gguf_arch import arch_spec, unpermute_rows
    from swama.engine.files.gguf_import import check_tensor_types, read_gguf, tensor_values

    try:
        gguf = read_gguf(path)
        kind = gguf.metadata.get("general.type", "model")
        if kind != "adapter" or gguf.metadata.get("adapter.type") != "lora":
            raise AdapterFormatError(
                f"{path.name} is a GGUF {kind}, not a LoRA adapter (general.type 'adapter', adapter.type 'lora')"
                + ("; install a GGUF model with `swama pull` or `swama import`." if kind == "model" else "."))
        spec = arch_spec(gguf.metadata)
        check_tensor_types(gguf)
    except GGUFImportError as exc:
        raise AdapterFormatError(f"{path.name}: {exc}") from None
    heads, kv_heads = _gguf_heads(gguf.metadata, base_config)
    tensors = {t.name: t for t in gguf.tensors}
    pairs = {name.removesuffix(".lora_a"): name.removesuffix(".lora_a") + ".lora_b" for name in tensors
             if name.endswith(".lora_a")}
    raw: dict[str, tuple[Any, Any]] = {}
    for base_name, b_name in pairs.items():
        if b_name not in tensors:
            raise AdapterFormatError(f"{path.name} has {base_name}.lora_a but no {b_name}.")
        mlx_name = spec.mlx_name(base_name)
        if mlx_name is None or not mlx_name.endswith(".weight"):
            raise AdapterFormatError(f"{path.name}: {base_name} is not a linear layer of a "
                                     f"{gguf.metadata.get('general.architecture')} model swama reads.")
        a, b = tensor_values(tensors[base_name + ".lora_a"]), tensor_values(tensors[b_name])
        if spec.permute_qk and mlx_name.endswith(("q_proj.weight", "k_proj.weight")):
            n = heads if mlx_name.endswith("q_proj.weight") else kv_heads
            if not isinstance(n, int) or n <= 0 or b.shape[0] % (2 * n):
                raise AdapterFormatError(f"{path.name}: {base_name}'s rows cannot be put back in order: the "
                                         "head count is missing or does not divide them.")
            b = unpermute_rows(b, n)
        raw[mlx_name.removesuffix(".weight")] = (a, b)
    alpha = float(gguf.metadata.get("adapter.lora.alpha", 0.0) or 0.0)
    modules = {}
    for name, (a, b) in raw.items():
        scale = alpha / a.shape[0] if alpha else 1.0
        modules[name] = (mx.array(np.ascontiguousarray(a.T)), mx.array(np.ascontiguousarray(b.T)) * scale)
    return _checked(path, modules, "gguf")


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


def read_adapter(folder: Path, base_config: dict[str, Any] | None = None) -> AdapterWeights:
    """The adapter in `folder` (or GGUF file), in any of the forms above; AdapterFormatError when it is
    none of them. `base_config` (the base's config.json) gives a GGUF file head counts it lacks."""
    kind = adapter_format(folder)
    if kind == "gguf":
        return _read_gguf(folder, base_config or {})
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
        f"{folder} is not a LoRA adapter folder: expected mlx-lm's ({' and '.join(MLX_FILES)}), PEFT's "
        f"({' and '.join(PEFT_FILES)}), or llama.cpp's GGUF LoRA file.")


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
