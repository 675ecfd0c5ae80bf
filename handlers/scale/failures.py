"""What a client gets when the replica serving its request fails: a 503 in the route family's own
error envelope before the response began, and after a stream began the end that route gives a stream
whose engine failed (a chat chunk with finish_reason "error", a `response.failed` event, else an
error event), so every client that reads the route's errors reads this one too."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

from swama.handlers.http.errors import ApiError, error_body
from swama.handlers.http.openapi import family_for

REPLICA_FAILED = "replica_failed"
FAILED_MESSAGE = ("The replica serving this request stopped before it finished ({cause}). New requests go to "
                  "the replicas still running and the failed one is being replaced; retry the request.")
# A stream's first frame is read to end it alike; a frame past this size is not looked for.
_FIRST_FRAME_LIMIT = 1 << 20


def failure_message(cause: str) -> str:
    return FAILED_MESSAGE.format(cause=cause)


def failure_response(path: str, err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(family_for(path), err), status_code=err.status, headers=err.headers)


def replica_failed(path: str, cause: str) -> JSONResponse:
    """The 503 for a request whose replica failed before answering."""
    err = ApiError(503, failure_message(cause), code=REPLICA_FAILED, headers={"Retry-After": "1"})
    return failure_response(path, err)


def _sse(data: dict[str, Any], event: str | None = None) -> bytes:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


class StreamWatch:
    """Watches a server-sent event stream pass (its first frame, and how many frames went by), enough
    to end it as its route would after a failure."""

    def __init__(self, path: str, content_type: bytes | None) -> None:
        self.path = path
        self.sse = (content_type or b"").split(b";")[0].strip().lower() == b"text/event-stream"
        self.first: dict[str, Any] | None = None
        self.frames = 0
        self._head = b""
        self._last = b""

    def feed(self, chunk: bytes) -> None:
        if not self.sse:
            return
        # Frames end with a blank line; JSON data never holds a raw newline, so counting is exact.
        self.frames += (self._last + chunk).count(b"\n\n")
        self._last = chunk[-1:]
        if self.first is None and len(self._head) < _FIRST_FRAME_LIMIT:
            self._head += chunk
            frame, sep, _ = self._head.partition(b"\n\n")
            if sep:
                self.first = self._data(frame) or {}

    @staticmethod
    def _data(frame: bytes) -> dict[str, Any] | None:
        for line in frame.split(b"\n"):
            if line.startswith(b"data:"):
                try:
                    data = json.loads(line[5:])
                except ValueError:
                    return None
                return data if isinstance(data, dict) else None
        return None

    def tail(self, message: str) -> bytes:
        """The bytes that end the stream after a failure (none for a body that is not a stream)."""
        if not self.sse:
            return b""
        first = self.first or {}
        if self.path == "/v1/chat/completions":
            chunk = {key: first.get(key) for key in ("id", "object", "created", "model")}
            chunk["choices"] = [{"index": 0, "delta": {}, "finish_reason": "error", "logprobs": None}]
            chunk["error"] = {"message": message, "type": "server_error", "code": REPLICA_FAILED}
            return _sse(chunk) + b"data: [DONE]\n\n"
        if self.path == "/v1/responses" and isinstance(first.get("response"), dict):
            response = {**first["response"], "status": "failed", "output": [], "usage": None,
                        "error": {"code": "server_error", "message": message}}
            return _sse({"type": "response.failed", "sequence_number": self.frames, "response": response},
                        "response.failed")
        return _sse({"error": {"message": message, "type": "server_error", "code": REPLICA_FAILED}}, "error")
