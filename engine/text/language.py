"""Language models through mlx-lm: the loader of the kind the generator and the scorer serve most."""

from __future__ import annotations

import json
from pathlib import Path

from swama.engine.model import LoadedModel, cast_for_device, eos_ids_of
from swama.engine.ranks import group as ranks
from swama.engine.ranks import sharding
from swama.engine.runtime import on_gpu
from swama.engine.text import gated_delta_cuda
from swama.engine.text.cpu_forward import install as install_cpu_forward


def load_language_model(model_id: str, path: Path) -> LoadedModel:
    from mlx_lm import load

    group = ranks.current()
    split = group is not None and group.model_id == model_id
    model, tokenizer = load(str(path), lazy=split)
    if split:
        # Split before the weights are read, so this rank reads only its own share of them.
        group.split = sharding.plan(path, group.size, group.backend, model)
        sharding.shard(model, group.group, group.split)
    cast_for_device(model)
    if not on_gpu():
        install_cpu_forward(model)
    else:
        gated_delta_cuda.install()
    config = json.loads((path / "config.json").read_text())
    loaded = LoadedModel(model_id, path, model, tokenizer, config, eos_ids_of(path, tokenizer))
    loaded.beside.set(ranks.RankGroup, group if split else None)
    return loaded


def load_language_face(model_id: str, path: Path) -> LoadedModel:
    """The model as a front end needs it: its tokenizer, chat template, config and end tokens, loaded
    as `load_language_model` loads them, with no weights (`model` is None). A server process whose
    engine runs in another process renders, tokenizes and detokenizes with it."""
    from mlx_lm.utils import load_config, load_tokenizer

    tokenizer = load_tokenizer(path, eos_token_ids=load_config(path).get("eos_token_id"))
    config = json.loads((path / "config.json").read_text())
    return LoadedModel(model_id, path, None, tokenizer, config, eos_ids_of(path, tokenizer))
