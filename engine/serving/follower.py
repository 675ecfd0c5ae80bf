"""A rank other than 0 of a group that splits one model: it loads its shard, then runs every turn
rank 0 shares until the group ends (engine/ranks/group.py exits the process when it fails)."""

from __future__ import annotations

from swama.engine.files.store import ModelStore
from swama.engine.ranks.group import current, shard_name
from swama.engine.serving.loaders import load_model
from swama.engine.serving.scheduler import Scheduler
from swama.engine.settings import EngineSettings
from swama.engine.speculative.policy import speculation_of
from swama.engine.text.kv_policy import use_kv_quant
from swama.engine.text.prompt_cache import prompt_cache_for


def follow(settings: EngineSettings, model_id: str) -> None:
    """Serve this rank's shard of `model_id` (installed) with the same batch settings as rank 0."""
    group = current()
    if group is None or group.rank == 0:
        raise ValueError("follow() runs on a rank other than 0 of a group")
    installed = ModelStore(settings.models_root).get(model_id)
    group.model_id = installed.id
    model = load_model(installed.id, installed.path)
    use_kv_quant(model, settings.kv_quant())
    cache = prompt_cache_for(model, settings.prompt_cache_budget(), settings.prompt_disk_dir(),
                             settings.prompt_cache_disk_bytes, shard_name(group))
    scheduler = Scheduler(model, prompt_cache=cache, batching=True,
                          rows=settings.batch_rows, prefill_step=settings.prefill_step,
                          prefill_wait=settings.prefill_wait,
                          speculation=speculation_of(settings))
    try:
        scheduler.join()
    finally:
        if cache is not None:
            cache.close()  # the blocks handed to the disk tier's writer reach the disk
