"""GET /v1/models: the OpenAI list shape over the local model store."""

from __future__ import annotations

from typing import Any

from swama.engine.store import list_installed
from swama.handlers.dispatch import Call, route


@route()
async def list_models(call: Call, request: None) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": m.id, "object": "model", "created": m.created, "owned_by": "swama",
             "size_in_bytes": m.size_in_bytes}
            for m in list_installed(call.settings.models_root)
        ],
    }
