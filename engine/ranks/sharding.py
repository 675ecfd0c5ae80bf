"""How a model splits across ranks, with mlx-lm's own sharding: tensor parallel where the architecture
has `shard()` (every layer's projections split, each rank holding 1/N of them), else pipeline
parallel where it has `pipeline()` (each rank holding a run of layers; it sends activations from rank
to rank, which NCCL cannot do). Any other architecture, or a split that does not divide the
model's heads, is refused before a rank starts, with what would work instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swama.engine.errors import BadInput

TENSOR, PIPELINE = "tensor", "pipeline"


def _families() -> tuple[list[str], list[str]]:
    """The mlx-lm model families with tensor and with pipeline sharding (read from their sources, so
    no family is imported)."""
    import mlx_lm.models

    tensor, pipeline = [], []
    for source in sorted(Path(mlx_lm.models.__path__[0]).glob("*.py")):
        text = source.read_text(errors="replace")
        if "    def shard(" in text:
            tensor.append(source.stem)
        if "PipelineMixin" in text and source.stem != "pipeline":
            pipeline.append(source.stem)
    return tensor, pipeline


def _divides(config: dict[str, Any], ranks: int) -> str | None:
    """Why a tensor split over `ranks` does not divide the model's heads and widths evenly, if so."""
    text = config.get("text_config") or config
    sizes = {"attention heads": text.get("num_attention_heads"),
             "key/value heads": text.get("num_key_value_heads") or text.get("num_attention_heads"),
             "MLP width": text.get("intermediate_size")}
    uneven = {name: n for name, n in sizes.items() if isinstance(n, int) and n % ranks}
    if not uneven:
        return None
    counts = [n for n in sizes.values() if isinstance(n, int)]
    fits = [r for r in range(2, 9) if all(n % r == 0 for n in counts)]
    what = ", ".join(f"{n} {name}" for name, n in uneven.items())
    return (f"its {what} do not split evenly over {ranks} ranks"
            + (f"; it splits over {', '.join(map(str, fits))} ranks" if fits else "; it splits over no rank count up to 8"))


def plan(path: Path, ranks: int, backend: str, model: Any = None) -> str:
    """The split the model in `path` takes over `ranks` ranks (TENSOR or PIPELINE); BadInput naming
    what is supported when it takes none. `model`: the model already loaded lazily, if it is."""
    import json

    from mlx_lm.utils import load_model

    config = json.loads((path / "config.json").read_text())
    if model is None:
        model, _ = load_model(path, lazy=True, strict=False)
    family = config.get("model_type", "?")
    if hasattr(model, "shard"):
        if (why := _divides(config, ranks)) is None:
            return TENSOR
        raise BadInput(f"The model ({family}) cannot be split across {ranks} ranks: {why}.")
    if hasattr(getattr(model, "model", None), "pipeline"):
        if backend == "nccl":
            raise BadInput(f"The model ({family}) splits only as a pipeline, which sends activations between ranks; "
                           "the NCCL backend cannot (use --rank-backend ring).")
        return PIPELINE
    tensor, pipeline = _families()
    raise BadInput(f"The model ({family}) cannot be split across ranks: mlx-lm shards only these families, "
                   f"tensor parallel: {', '.join(tensor)}; pipeline parallel: {', '.join(pipeline)}.")


def shard(model: Any, group: Any, split: str) -> None:
    """Split a lazily loaded model across `group` in place, before its weights are read, so each
    rank reads only its own share of them."""
    if split == TENSOR:
        model.shard(group)
    else:
        model.model.pipeline(group)
