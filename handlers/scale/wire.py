"""What passes between the ingress and an engine replica: the HTTP request as the ingress read it, and
the response as the replica's app sends it (its start, then its body in chunks as they come)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Headers = list[tuple[bytes, bytes]]


@dataclass
class ForwardedRequest:
    method: str
    path: str
    query_string: bytes
    headers: Headers
    body: bytes
    client: tuple[str, int] | None = None
    scheme: str = "http"

    def scope(self) -> dict[str, Any]:
        """The ASGI scope the replica's app sees: the request as it reached the ingress."""
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                "method": self.method, "scheme": self.scheme, "path": self.path, "raw_path": self.path.encode(),
                "query_string": self.query_string, "root_path": "", "headers": self.headers,
                "client": self.client, "server": None, "state": {}}


@dataclass
class ResponseStart:
    status: int
    headers: Headers = field(default_factory=list)

    def header(self, name: bytes) -> bytes | None:
        return next((value for key, value in self.headers if key.lower() == name), None)
