"""/v1/files: uploads for batch jobs and the files the jobs write, reached only through their ids.

Every id names a row of the batch store (handlers/batch/store.py), which alone turns an id into a
path under its own folder: nothing a client sends ever becomes a path on disk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Response

from swama.generated.openai_models import CreateFileRequest
from swama.handlers.batch.input import check_upload
from swama.handlers.batch.store import BatchStore
from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.pipeline import Call, RouteRules, route

RULES = RouteRules(handled=frozenset({"file", "purpose", "expires_after"}))
MAX_LIST = 10_000


def store_of(call: Call) -> BatchStore:
    store = getattr(call.request.app.state, "batch_store", None)
    if store is None:  # an app whose lifespan never ran: a replica behind Ray Serve, an in-process test
        raise ApiError(503, "Files and batches are served by a single `swama serve` (not by replicas behind "
                            "--replicas): this server has no data store.", code="unavailable")
    return store


def present(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields that have a value: the document gives most of them no null."""
    return {key: value for key, value in fields.items() if value is not None}


def file_view(record: dict[str, Any]) -> dict[str, Any]:
    return present({"id": record["id"], "object": "file", "bytes": record["bytes"], "created_at": record["created_at"],
                    "expires_at": record["expires_at"], "filename": record["filename"], "purpose": record["purpose"],
                    "status": "processed"})


def no_such(kind: str, value: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"No {kind} with id '{value}'.", code="not_found", param=param or f"{kind}_id")


def by_id(call: Call, kind: str, lookup: Callable[[str], dict[str, Any] | None]) -> dict[str, Any]:
    """The record the path's `<kind>_id` names, or a 404."""
    value = call.request.path_params[f"{kind}_id"]
    record = lookup(value)
    if record is None:
        raise no_such(kind, value)
    return record


def _file(call: Call) -> dict[str, Any]:
    return by_id(call, "file", store_of(call).file)


def query_limit(call: Call, default: int, most: int) -> int:
    raw = call.request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise bad_request(f"'limit' must be an integer from 1 to {most}.", param="limit")
    return int(raw)


@route(RULES)
async def create_file(call: Call, request: CreateFileRequest) -> dict[str, Any]:
    filename = (getattr(call.request.state, "upload_names", {}).get("file") or "upload").rsplit("/", 1)[-1]
    if request.purpose.value == "batch":
        await asyncio.to_thread(check_upload, request.file, filename)
    expires = request.expires_after.seconds if request.expires_after is not None else None
    store, quota = store_of(call), call.settings.files_quota_bytes
    # Checked before writing; uploads in flight at once may pass it together, each within the body limit.
    if (used := await asyncio.to_thread(store.stored_bytes)) + len(request.file) > quota:
        raise ApiError(413, f"The files stored here take {used:,} bytes; this one ({len(request.file):,} bytes) would pass "
                            f"the server's quota of {quota:,} (--files-quota-bytes). Delete files first.",
                       code="files_quota_exceeded", param="file")
    record = await asyncio.to_thread(store.add_file, request.file, request.purpose.value, filename, expires)
    return file_view(record)


@route()
async def list_files(call: Call, request: None) -> dict[str, Any]:
    query = call.request.query_params
    limit = query_limit(call, MAX_LIST, MAX_LIST)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be 'asc' or 'desc'.", param="order")
    records = store_of(call).files(query.get("purpose"))
    if order == "desc":
        records.reverse()
    after = query.get("after")
    if after is not None:
        ids = [r["id"] for r in records]
        records = records[ids.index(after) + 1:] if after in ids else []
    page = records[:limit]
    return {"object": "list", "data": [file_view(r) for r in page], "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(records) > limit}


@route()
async def retrieve_file(call: Call, request: None) -> dict[str, Any]:
    return file_view(_file(call))


@route()
async def delete_file(call: Call, request: None) -> dict[str, Any]:
    record = _file(call)
    await asyncio.to_thread(store_of(call).delete_file, record["id"])
    return {"id": record["id"], "object": "file", "deleted": True}


@route()
async def download_file(call: Call, request: None) -> Response:
    record = _file(call)
    data = await asyncio.to_thread(store_of(call).path_of(record["id"]).read_bytes)
    return Response(data, media_type="application/octet-stream")
