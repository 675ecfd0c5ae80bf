"""Engine errors carry an HTTP status and a short code; handlers put them in their route's envelope."""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request", param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param  # the request field at fault, where one is
        self.headers = headers  # e.g. Retry-After on a capacity refusal


class Cancelled(Exception):
    """The client went away; the work was stopped."""
