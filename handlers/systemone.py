"""POST /v1/systemone."""

from __future__ import annotations

import json
from typing import Any

from swama.handlers.dispatch import Call, not_implemented
from swama.handlers.errors import bad_request


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise bad_request(f"Duplicate SystemOne object key '{key}'.")
        out[key] = value
    return out


def _parse(body: bytes) -> Any:
    return json.loads(body, object_pairs_hook=_no_duplicates)


async def create_system_one(call: Call) -> None:
    data = call.json(parse=_parse)
    if not isinstance(data, dict):
        raise bad_request("The SystemOne request must be an object.")
    call.validate(data)
    raise not_implemented(call, validate=False)
