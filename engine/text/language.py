"""Language models through mlx-lm: the loader of the kind the generator and the scorer serve most."""

from __future__ import annotations

import json
from pathlib import Path

from swama.engine.model import LoadedModel, cast_for_device, eos_ids_of
from swama.engine.runtime import on_gpu
from swama.engine.text.cpu_forward import install as install_cpu_forward


def load_language_model(model_id: str, path: Path) -> LoadedModel:
    from mlx_lm import load

    model, tokenizer = load(str(path))
    cast_for_device(model)
    if not on_gpu():
        install_cpu_forward(model)
    config = json.loads((path / "config.json").read_text())
    return LoadedModel(model_id, path, model, tokenizer, config, eos_ids_of(path, tokenizer))
