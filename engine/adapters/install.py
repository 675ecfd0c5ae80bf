"""`swama create ADAPTER_DIR --base MODEL --name NAME`: a LoRA adapter checked against its base model and
installed into the store beside it, atomically (the store's staging folder): a refused adapter leaves
nothing behind."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

from swama.engine.adapters.formats import AdapterFormatError, AdapterWeights, read_adapter, write_adapter
from swama.engine.errors import StoreError
from swama.engine.files.kinds import LANGUAGE
from swama.engine.files.store import InstalledModel, ModelStore


def _header(path: Path) -> dict[str, dict]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def _config(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def linear_shapes(folder: Path) -> dict[str, tuple[int, int]]:
    """Every linear layer of the MLX model in `folder` as (in, out), read from the safetensors headers
    alone (no weights loaded); a quantized layer's input width from its scales and group size."""
    config = _config(folder)
    quant = config.get("quantization") or config.get("quantization_config") or {}
    group = int(quant.get("group_size", 64)) if isinstance(quant, dict) else 64
    tensors: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update({k: v["shape"] for k, v in _header(path).items()})
    shapes = {}
    for key, shape in tensors.items():
        if not key.endswith(".weight") or len(shape) != 2:
            continue
        name = key[: -len(".weight")]
        scales = tensors.get(name + ".scales")
        shapes[name] = (scales[1] * group if scales else shape[1], shape[0])
    return shapes


def check_fits(adapter: AdapterWeights, base: InstalledModel) -> None:
    """Refuse an adapter whose modules the base model lacks or whose widths differ from the base's."""
    shapes = linear_shapes(base.path)
    missing = [n for n in adapter.modules if n not in shapes]
    if missing:
        raise AdapterFormatError(
            f"The adapter targets {len(missing)} module(s) model '{base.id}' does not have (first: {missing[0]}); "
            "it was trained for another base model.")
    for name, (n_in, n_out) in adapter.shapes().items():
        if shapes[name] != (n_in, n_out):
            raise AdapterFormatError(
                f"The adapter's {name} maps {n_in} to {n_out} features, but model '{base.id}' has "
                f"{shapes[name][0]} to {shapes[name][1]} there; it was trained for another base model.")


def create_adapter(store: ModelStore, path: Path, name: str, base_name: str,
                   say: Callable[[str], None] = print) -> InstalledModel:
    """Install the adapter at `path` (mlx-lm's or PEFT's folder, llama.cpp's GGUF file) under `name`,
    against the installed `base_name`."""
    path = path.expanduser()
    if not path.is_dir() and not (path.is_file() and path.suffix.lower() == ".gguf"):
        raise StoreError(f"{path} is neither a folder nor a .gguf file; an adapter is a folder with "
                         "adapter_config.json and its weights, or llama.cpp's GGUF LoRA file.")
    base = store.find(base_name)
    if base is None:
        raise StoreError(f"--base: no installed model is named '{base_name}' (`swama list` shows the installed ones).")
    if base.base is not None:
        raise StoreError(f"--base: '{base.id}' is itself an adapter (of '{base.base}'); name a base model.")
    if base.kind != LANGUAGE:
        raise StoreError(f"--base: '{base.id}' is {base.kind} model; adapters are served on language models.")
    taken = store.find(name)
    if taken is not None:
        raise StoreError(f"The name '{name}' is already taken by an installed model ({taken.id}); "
                         f"choose another, or remove it first (swama rm {taken.id}).")
    adapter = read_adapter(path, _config(base.path))  # AdapterFormatError (a StoreError) says what is wrong
    check_fits(adapter, base)
    model = store.install(name, lambda staging: write_adapter(staging, adapter, base.id),
                          source=f"adapter:{path}", card={"base": base.id})
    say(f"Installed adapter {model.id} (rank {adapter.rank}, {len(adapter.modules)} modules, "
        f"{adapter.source_format} format) on {base.id}")
    return model
