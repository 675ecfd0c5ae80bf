"""POST /v1/chat/completions."""

from __future__ import annotations

from swama.handlers.dispatch import Call, not_implemented


async def create_chat_completion(call: Call) -> None:
    raise not_implemented(call)
