"""/v1/batches: jobs made of a JSON-lines file, run by handlers/batch/runner.py behind live traffic.

A job is checked whole when it is created (its file, every line's custom_id, method and url) and
then answered line by line through the endpoint's own route; `/v1/decisions` is this server's
extension to OpenAI's list of batch endpoints.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from swama.generated.openai_models import CreateBatchRequest
from swama.handlers.batch.input import batch_lines
from swama.handlers.batch.runner import BatchRunner
from swama.handlers.batch.store import BatchStore
from swama.handlers.http.errors import bad_request
from swama.handlers.http.pipeline import Call, RouteRules, route
from swama.handlers.routes.files import by_id, no_such, present, query_limit, store_of

RULES = RouteRules(handled=frozenset({"input_file_id", "endpoint", "completion_window", "metadata",
                                      "output_expires_after"}))
TIMES = ("in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
         "cancelling_at", "cancelled_at")


def runner_of(call: Call) -> BatchRunner:
    return call.request.app.state.batches


def batch_view(store: BatchStore, record: dict[str, Any]) -> dict[str, Any]:
    counts = store.counts(record["id"])
    done = record["status"] in ("completed", "expired", "cancelled")
    files = {key: record[key] if done and store.file(record[key]) is not None else None
             for key in ("output_file_id", "error_file_id")}
    errors = json.loads(record["errors"]) if record["errors"] else None
    input_tokens, output_tokens = store.usage(record["id"])
    return present({
        "id": record["id"], "object": "batch", "endpoint": record["endpoint"], "model": record["model"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": record["input_file_id"], "completion_window": record["completion_window"],
        "status": record["status"], **files, "created_at": record["created_at"],
        **{key: record[key] for key in TIMES},
        "request_counts": {"total": record["total"], "completed": counts["completed"], "failed": counts["failed"]},
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + output_tokens},
        "metadata": json.loads(record["metadata"]) if record["metadata"] else None,
    })


def _batch(call: Call) -> dict[str, Any]:
    return by_id(call, "batch", store_of(call).batch)


@route(RULES)
async def create_batch(call: Call, request: CreateBatchRequest) -> dict[str, Any]:
    store = store_of(call)
    source = store.file(request.input_file_id)
    if source is None:
        raise no_such("file", request.input_file_id, "input_file_id")
    if source["purpose"] != "batch":
        raise bad_request(f"File '{source['id']}' has purpose '{source['purpose']}'; a batch reads files of purpose "
                          "'batch'.", param="input_file_id")
    data = await asyncio.to_thread(store.path_of(source["id"]).read_bytes)
    endpoint = request.endpoint.value
    lines, model = await asyncio.to_thread(batch_lines, data, source["id"], endpoint)
    expires = request.output_expires_after.seconds if request.output_expires_after is not None else None
    metadata = request.metadata.root if request.metadata is not None else None
    batch_id = await asyncio.to_thread(store.add_batch, endpoint, source["id"], request.completion_window.value,
                                       lines, metadata, model, expires)
    runner_of(call).submit(batch_id)
    return batch_view(store, store.batch(batch_id) or {})


@route()
async def list_batches(call: Call, request: None) -> dict[str, Any]:
    limit = query_limit(call, 20, 100)
    store = store_of(call)
    records = store.batches()
    after = call.request.query_params.get("after")
    if after is not None:
        ids = [r["id"] for r in records]
        records = records[ids.index(after) + 1:] if after in ids else []
    page = [batch_view(store, r) for r in records[:limit]]
    body: dict[str, Any] = {"object": "list", "data": page, "has_more": len(records) > limit}
    if page:
        body.update(first_id=page[0]["id"], last_id=page[-1]["id"])
    return body


@route()
async def retrieve_batch(call: Call, request: None) -> dict[str, Any]:
    return batch_view(store_of(call), _batch(call))


@route()
async def cancel_batch(call: Call, request: None) -> dict[str, Any]:
    record = _batch(call)
    if record["status"] not in ("cancelling", "cancelled") and not runner_of(call).cancel(record["id"]):
        record = _batch(call)  # it may have ended since it was read
        if record["status"] not in ("cancelling", "cancelled"):
            raise bad_request(f"Batch '{record['id']}' is {record['status']}; only a batch that is validating or in "
                              "progress can be cancelled.", param="batch_id")
    return batch_view(store_of(call), _batch(call))
