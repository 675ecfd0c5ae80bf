"""Who a request is answered for: a client waiting on it, or a line of a batch job.

The front end's batch runner sets `BATCH` around each line it sends through a route; the door stamps
it on the request (`ChatRequest.batch`, `DecisionJob.batch`), so it crosses to an engine process with
the request. The schedulers admit live requests first and let batch lines fill the rest: a live
prompt is read before batch prompts that wait with it, and live decision requests are packed and
scored before batch ones.
"""

from __future__ import annotations

from contextvars import ContextVar

BATCH: ContextVar[bool] = ContextVar("swama_batch_line", default=False)


def live_first(items: list, is_batch) -> list:  # type: ignore[type-arg]
    """`items` with live ones first, each group in its own order."""
    return sorted(items, key=lambda item: bool(is_batch(item)))
