"""Running batch jobs: every line through the live route's own pipeline, behind live traffic, durably.

A job's lines go to the route its `endpoint` names exactly as an HTTP request would (the generated
model, the route's rules, the handler, the engine), inside this process: no socket, and the same
answer a live client gets, refusals included. The engine is told each line comes from a batch
(`engine.client.BATCH`), so its schedulers admit live requests first and batch lines fill the rest.

Each job has at most `lines_in_flight` lines in flight; jobs run side by side, so one model's job
never waits for another's. A line the engine turns away for now (429: queues full; 503: the model
unloading or timed out) is tried again, never recorded as failed. The job resumes after a restart
from the store: lines not yet committed run again, committed ones never do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request

from swama.engine.client import BATCH
from swama.handlers.batch.store import BatchStore, Line, new_id

log = logging.getLogger("swama.batch")

ENDPOINT_OPERATIONS = {
    "/v1/chat/completions": "createChatCompletion",
    "/v1/responses": "createResponse",
    "/v1/completions": "createCompletion",
    "/v1/embeddings": "createEmbedding",
    "/v1/decisions": "createDecision",
}
RETRY_STATUSES = (429, 503)  # the engine's "not now": the line waits and goes again
RETRY_SECONDS = 1.0
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


class BatchRunner:
    def __init__(self, app: FastAPI, store: BatchStore, lines_in_flight: int, api_key: str | None) -> None:
        self.app, self.store = app, store
        self.lines_in_flight = lines_in_flight
        self.api_key = api_key
        self._jobs: dict[str, asyncio.Task[None]] = {}
        self._running = 0  # lines being answered now, over every job
        self._closing = False

    # -- the event loop's side ---------------------------------------------------------------------

    async def start(self) -> None:
        """Take up every job a previous run of the server left unfinished."""
        for batch_id in self.store.active():
            log.info("resuming batch %s", batch_id)
            self.submit(batch_id)

    async def close(self) -> None:
        """Stop every job where it stands: what is committed stays, the rest runs after a restart."""
        self._closing = True
        for task in self._jobs.values():
            task.cancel()
        await asyncio.gather(*self._jobs.values(), return_exceptions=True)
        self._jobs.clear()

    def submit(self, batch_id: str) -> None:
        if batch_id not in self._jobs and not self._closing:
            task = asyncio.get_running_loop().create_task(self._job(batch_id), name=f"batch {batch_id}")
            self._jobs[batch_id] = task
            task.add_done_callback(lambda _: self._jobs.pop(batch_id, None))

    def cancel(self, batch_id: str) -> bool:
        """Ask a validating or running job to stop; its task finalizes it as `cancelled`."""
        if not self.store.set_status(batch_id, "cancelling", only_from=("validating", "in_progress")):
            return False
        self.submit(batch_id)  # a job with no task (never here, but cheap) still gets finalized
        return True

    def line_counts(self) -> dict[str, int]:
        counts = self.store.line_counts()
        running = min(self._running, counts["queued"])
        return {"queued": counts["queued"] - running, "running": running, "finished": counts["finished"]}

    async def wait(self, batch_id: str) -> None:
        """Until the job's task ends (tests and tools)."""
        task = self._jobs.get(batch_id)
        if task is not None:
            await asyncio.wait({task})

    # -- one job -----------------------------------------------------------------------------------

    async def _job(self, batch_id: str) -> None:
        try:
            await self._drive(batch_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: the job fails visibly instead of hanging in progress
            log.exception("batch %s failed", batch_id)
            self.store.set_status(batch_id, "failed", errors=[{"code": "server_error",
                                                               "message": "The batch failed on the server."}])

    async def _drive(self, batch_id: str) -> None:
        record = self.store.batch(batch_id)
        if record is None:
            return
        if record["status"] == "validating":
            self.store.set_status(batch_id, "in_progress", only_from=("validating",))
        record = self.store.batch(batch_id) or record
        if record["status"] == "in_progress":
            await self._run_lines(record)
        record = self.store.batch(batch_id) or record
        # Writing the files may take a while for a large job: off the event loop.
        if record["status"] == "cancelling":
            await asyncio.to_thread(self._finalize, record, "cancelled")
        elif record["status"] in ("in_progress", "finalizing"):
            expired = record["expires_at"] is not None and time.time() >= record["expires_at"]
            if expired:
                await asyncio.to_thread(self._expire_pending, batch_id)
            self.store.set_status(batch_id, "finalizing", only_from=("in_progress",))
            await asyncio.to_thread(self._finalize, record, "expired" if expired else "completed")

    async def _run_lines(self, record: dict[str, Any]) -> None:
        batch_id, endpoint = record["id"], record["endpoint"]
        slots = asyncio.Semaphore(self.lines_in_flight)
        tasks: set[asyncio.Task[None]] = set()
        try:
            for line in list(self.store.pending(batch_id)):
                await slots.acquire()
                if self._stopped(record):
                    slots.release()
                    break
                task = asyncio.create_task(self._line(record, endpoint, line))
                tasks.add(task)
                task.add_done_callback(lambda t: (tasks.discard(t), slots.release()))
            if tasks:
                await asyncio.wait(tasks)
        finally:
            for task in tasks:
                task.cancel()

    def _stopped(self, record: dict[str, Any]) -> bool:
        current = self.store.batch(record["id"])
        return (current is None or current["status"] != "in_progress"
                or (record["expires_at"] is not None and time.time() >= record["expires_at"]))

    async def _line(self, record: dict[str, Any], endpoint: str, line: Line) -> None:
        self._running += 1
        try:
            while True:
                status, body = await self._answer(endpoint, line)
                if status not in RETRY_STATUSES or self._stopped(record):
                    break
                await asyncio.sleep(RETRY_SECONDS)
        finally:
            self._running -= 1
        result = {"id": new_id("batch_req_"), "custom_id": line.custom_id,
                  "response": {"status_code": status, "request_id": new_id("req_"), "body": body}, "error": None}
        self.store.finish_line(record["id"], line.line, 200 <= status < 300, result, _tokens(body))

    async def _answer(self, endpoint: str, line: Line) -> tuple[int, Any]:
        """The live route's answer to one line: its status and its JSON body."""
        from swama.generated.routes import OPERATIONS
        from swama.handlers.http.pipeline import dispatch

        body = json.loads(line.body)
        if body.get("stream") is True:
            return 400, {"error": {"message": "Streaming is not available in a batch: a line's body may not set "
                                              "'stream' to true.", "type": "invalid_request_error",
                                   "param": "stream", "code": "unsupported_parameter"}}
        data = line.body.encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if self.api_key:
            headers.append((b"authorization", f"Bearer {self.api_key}".encode()))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": endpoint, "raw_path": endpoint.encode(), "query_string": b"",
                 "root_path": "", "headers": headers, "client": ("batch", 0), "server": ("batch", 0),
                 "app": self.app, "state": {}}
        sent = False
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:  # no disconnect ever comes: the job, not a client, owns this request
                await never.wait()
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}

        token = BATCH.set(True)
        try:
            response = await dispatch(OPERATIONS[ENDPOINT_OPERATIONS[endpoint]], Request(scope, receive))
        finally:
            BATCH.reset(token)
        body = getattr(response, "body", None)
        if body is None:  # a streamed answer: no route gives one to a line without `stream`, but never hang on it
            return 500, {"error": {"message": "The route answered with a stream, which a batch cannot hold.",
                                   "type": "server_error", "param": None, "code": "server_error"}}
        return response.status_code, json.loads(bytes(body))

    # -- the end of a job --------------------------------------------------------------------------

    def _expire_pending(self, batch_id: str) -> None:
        for line in list(self.store.pending(batch_id)):
            result = {"id": new_id("batch_req_"), "custom_id": line.custom_id, "response": None,
                      "error": {"code": "batch_expired", "message": EXPIRED_MESSAGE}}
            self.store.finish_line(batch_id, line.line, False, result, (0, 0))

    def _finalize(self, record: dict[str, Any], status: str) -> None:
        """Write the output and error files from the committed lines, then end the job. Run again after a
        crash, it writes the same files under the same ids."""
        batch_id = record["id"]
        expires = record["output_expires_seconds"]
        for ok, file_id, suffix in ((True, record["output_file_id"], "output"), (False, record["error_file_id"], "error")):
            data = "".join(line + "\n" for line in self.store.results(batch_id, ok)).encode()
            if data:
                self.store.add_file(data, "batch_output", f"{batch_id}_{suffix}.jsonl", expires, file_id=file_id)
        self.store.set_status(batch_id, status)
        log.info("batch %s %s", batch_id, status)


def _tokens(body: Any) -> tuple[int, int]:
    """Input and output tokens of a route's answer, from its usage (chat, completions, responses,
    embeddings, decisions)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    given = usage.get("input_tokens", usage.get("prompt_tokens", 0))
    made = usage.get("output_tokens", usage.get("completion_tokens", 0))
    return (given if isinstance(given, int) else 0), (made if isinstance(made, int) else 0)
