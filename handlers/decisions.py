"""POST /v1/decisions."""

from __future__ import annotations

from swama.handlers.dispatch import Call, not_implemented


async def create_decision(call: Call) -> None:
    raise not_implemented(call)
