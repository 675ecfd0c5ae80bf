"""POST /v1/responses."""

from __future__ import annotations

from swama.handlers.dispatch import Call, not_implemented


async def create_response(call: Call) -> None:
    raise not_implemented(call)
