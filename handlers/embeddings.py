"""POST /v1/embeddings."""

from __future__ import annotations

from swama.handlers.dispatch import Call, not_implemented


async def create_embedding(call: Call) -> None:
    raise not_implemented(call)
