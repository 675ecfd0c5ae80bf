"""A local Hugging Face hub endpoint over a folder, for exercising the real download code offline.

It answers the requests huggingface-hub makes for `snapshot_download` (repository info, then
HEAD/GET per file with Range support). `fail_after_bytes` cuts a download short, as a dropped
connection would.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class LocalHub:
    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.fail_after_bytes: int | None = None
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, head=True)

            def do_GET(self) -> None:
                hub._serve(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LocalHub:
        self.thread.start()
        return self

    def __exit__(self, *args: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _files(self, repo: str) -> list[Path]:
        root = self.repos[repo]
        return sorted(p for p in root.rglob("*") if p.is_file())

    def _serve(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append(f"{h.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            rest = parts[2:]
            repo = "/".join(rest[:2])
            if repo not in self.repos:
                return self._json(h, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            if len(rest) >= 4 and rest[2] == "tree":
                return self._json(h, 200, [
                    {"type": "file", "path": str(p.relative_to(self.repos[repo])), "size": p.stat().st_size,
                     "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for p in self._files(repo)])
            siblings = [{"rfilename": str(p.relative_to(self.repos[repo]))} for p in self._files(repo)]
            return self._json(h, 200, {"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings,
                                       "private": False, "tags": [], "downloads": 0, "likes": 0})
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, filename = "/".join(parts[:2]), "/".join(parts[4:])
            file = self.repos.get(repo, Path("/nonexistent")) / filename
            if not file.is_file():
                return self._json(h, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            data = file.read_bytes()
            etag = hashlib.sha256(data).hexdigest()
            start = 0
            rng = h.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0] or 0)
            body = data[start:]
            h.send_response(206 if start else 200)
            h.send_header("Content-Length", str(len(body)))
            h.send_header("ETag", f'"{etag}"')
            h.send_header("X-Repo-Commit", COMMIT)
            if start:
                h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            h.end_headers()
            if head:
                return None
            if self.fail_after_bytes is not None and len(body) > self.fail_after_bytes:
                h.wfile.write(body[: self.fail_after_bytes])
                h.wfile.flush()
                h.close_connection = True
                h.connection.shutdown(2)
                return None
            h.wfile.write(body)
            return None
        return self._json(h, 404, {"error": "not found"})

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, status: int, body: dict | list, headers: dict | None = None) -> None:
        raw = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.send_header("X-Repo-Commit", COMMIT)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(raw)
