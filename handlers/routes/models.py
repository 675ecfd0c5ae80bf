"""GET /v1/models: the installed models, in the OpenAI list shape and in System One's catalog shape.

One body carries both (`object`/`data` for OpenAI clients, `models` for System One clients), so
`client.models.list()` of either SDK reads it. A catalog entry of a model that answers decisions says
what a question that names no debiasing or calibration gets on it (`x_decision_defaults`); a language
model's says how its key/value cache is kept (`x_kv_cache`: the bits, group size and threshold of
--kv-bits, nulls at full precision, as for a model whose heads cannot be grouped so). Requests
cannot change either. A LoRA adapter's entry names its base model (`parent`, and `root`: the model whose
weights it runs on). `rerank` says whether /v1/rerank and /v2/rerank take the model.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from swama.engine.client import LANGUAGE, RERANKER, VISION, Defaults, InstalledModel, kv_cache_entry
from swama.handlers.http.pipeline import Call, route
from swama.handlers.http.settings import server_default_model
from swama.handlers.routes.decision_rules import decision_defaults
from swama.handlers.routes.systemone import SDK_DEFAULT_MODELS


def _day(created: int) -> str:
    return dt.datetime.fromtimestamp(created, dt.UTC).strftime("%Y-%m-%d")


def _catalog_entry(model: InstalledModel, defaults: Defaults, kv: Any) -> dict[str, Any]:
    source = f", from {model.source}" if model.source else ""
    entry: dict[str, Any] = {"name": model.id, "description": f"Installed model {model.id}{source}.",
                             "release_date": _day(model.created)}
    if model.kind in (LANGUAGE, VISION):  # it answers decisions through its next-token scores
        entry["x_decision_defaults"] = {"debias": defaults.debias, "calibration": defaults.calibration,
                                        "source": defaults.source}
    if model.kind == LANGUAGE:  # vision models keep full-precision caches
        entry["x_kv_cache"] = kv_cache_entry(kv, model.path)
    return entry


@route()
async def list_models(call: Call, request: None) -> dict[str, Any]:
    installed = call.engine.models()
    kv = call.settings.kv_quant()
    catalog = [_catalog_entry(m, decision_defaults(call.settings, m), kv) for m in installed]
    default = server_default_model(call.settings, call.engine)
    if default is not None:
        # System One clients send its default name; here it means the model the server started with.
        for alias in sorted(SDK_DEFAULT_MODELS):
            catalog.insert(0, {"name": alias, "description": f"The server's default model ({default.id}).",
                               "release_date": _day(default.created)})
    return {
        "object": "list",
        "data": [
            {"id": m.id, "object": "model", "created": m.created, "owned_by": "swama",
             "size_in_bytes": m.size_in_bytes, "kind": m.kind, "parent": m.base, "root": m.base or m.id,
             "rerank": m.kind in (LANGUAGE, VISION, RERANKER)}
            for m in installed
        ],
        "models": catalog,
    }
