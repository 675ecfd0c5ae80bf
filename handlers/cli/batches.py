"""`swama batches`: the batch jobs of a running server (list, show, watch, cancel).

It asks the server over its HTTP API (OpenAI's Batch API, standard library only, every request
bounded), never the engine in this process: it starts quickly, loads nothing, and works against a
server on another machine."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from typing import Any

from swama.engine.client import env_of
from swama.handlers.http.settings import ServerSettings

# The server's own defaults and variable, so that a plain `swama serve` is found and its key works.
DEFAULT_URL = "http://{host}:{port}".format(**{n: ServerSettings.model_fields[n].default for n in ("host", "port")})
API_KEY_ENV = env_of(ServerSettings, "api_key")
URL_ENV = "SWAMA_URL"
TIMEOUT = 10.0  # seconds, per request
PAGE_SIZE = 100
WATCH_EVERY = 1.0
FINAL = frozenset({"completed", "failed", "cancelled", "expired"})
BAR_WIDTH = 16
# The batch's moments, in the order a batch passes them.
MOMENTS = (("created", "created_at"), ("in progress", "in_progress_at"), ("finalizing", "finalizing_at"),
           ("completed", "completed_at"), ("failed", "failed_at"), ("cancelling", "cancelling_at"),
           ("cancelled", "cancelled_at"), ("expired", "expired_at"), ("expires", "expires_at"))

Batch = dict[str, Any]


class Failed(Exception):
    """A request that came back without a batch: the one line to print instead."""


def _add_connection(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """--url, --api-key and --json, on `swama batches` and again on each action (so they may stand before
    or after it); on the actions they default to nothing, so they do not undo one given before."""
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument("--url", default=default, metavar="URL",
                        help=f"the server's address (default {DEFAULT_URL}; env {URL_ENV})")
    parser.add_argument("--api-key", default=default, metavar="KEY",
                        help="sent as 'Authorization: Bearer KEY', for a server started with --api-key "
                             f"(env {API_KEY_ENV})")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS if suppress else False,
                        help="print the server's JSON instead of the readable form")


def add_parser(sub: argparse._SubParsersAction) -> None:
    batches = sub.add_parser(
        "batches", help="list, watch or cancel the batch jobs of a running server",
        description="The batch jobs (OpenAI's Batch API, /v1/batches) of a running swama server, asked over "
                    "HTTP. With no action, lists them.")
    _add_connection(batches, suppress=False)
    actions = batches.add_subparsers(dest="action", metavar="ACTION")

    lst = actions.add_parser("list", help="every batch job, newest first",
                             description="Every batch job of the server, newest first: its status, endpoint, "
                                         "model, lines answered of its total, lines failed and when it was "
                                         "created (local time).")
    _add_connection(lst, suppress=True)

    show = actions.add_parser("show", help="one batch job, with its progress",
                              description="One batch job: its status, progress bar (lines answered or failed "
                                          "of the total), files and moments (local time).")
    show.add_argument("id", help="the batch's id, e.g. batch_abc123")
    show.add_argument("--watch", action="store_true",
                      help="read it again every second until it completes, fails, is cancelled or expires "
                           "(Ctrl-C stops watching)")
    _add_connection(show, suppress=True)

    cancel = actions.add_parser("cancel", help="cancel a batch job",
                                description="Ask the server to cancel a batch job, and print its new status "
                                            "(cancelling while the lines running now end, then cancelled).")
    cancel.add_argument("id", help="the batch's id")
    _add_connection(cancel, suppress=True)
    batches.set_defaults(func=run_batches)


def run_batches(args: argparse.Namespace) -> int:
    server = Server(args.url or os.environ.get(URL_ENV) or DEFAULT_URL,
                    args.api_key or os.environ.get(API_KEY_ENV) or None)
    try:
        if args.action == "show":
            return watch(server, args.id, args.json) if args.watch else show(server, args.id, args.json)
        if args.action == "cancel":
            return cancel(server, args.id, args.json)
        return list_batches(server, args.json)
    except Failed as failure:
        print(f"error: {failure}", file=sys.stderr)
        return 1


# ---- HTTP -----------------------------------------------------------------------------------------


class Server:
    def __init__(self, url: str, api_key: str | None) -> None:
        # An OpenAI-style base URL (…/v1) names the same server.
        self.url = url.rstrip("/").removesuffix("/v1")
        self.api_key = api_key

    def ask(self, method: str, path: str, query: dict[str, str] | None = None) -> Any:
        target = self.url + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(target, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            with error:
                raise Failed(_http_error(error.code, error.reason, error.read())) from None
        except TimeoutError:
            raise Failed(f"the server at {self.url} did not answer within {TIMEOUT:g} s") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", error)
            raise Failed(f"no swama server answers at {self.url} ({reason}); start it with: swama serve") from None
        try:
            return json.loads(body)
        except ValueError:
            raise Failed(f"the answer from {target} is not JSON; is {self.url} a swama server?") from None


def _http_error(status: int, reason: str, body: bytes) -> str:
    """The server's own message (OpenAI's error envelope), on one line."""
    message = None
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        pass
    text = message if isinstance(message, str) and message.strip() else f"{reason}"
    return f"{' '.join(text.split())} (HTTP {status})"


def _path(batch_id: str, *rest: str) -> str:
    return "/".join(["/v1/batches", urllib.parse.quote(batch_id, safe=""), *rest])


def fetch_all(server: Server) -> list[Batch]:
    """Every page of the list, newest first."""
    batches: list[Batch] = []
    query = {"limit": str(PAGE_SIZE)}
    while True:
        page = server.ask("GET", "/v1/batches", query)
        data = page.get("data") or []
        batches.extend(data)
        last = page.get("last_id") or (data[-1].get("id") if data else None)
        # A page that does not move the cursor would repeat forever: it ends the list.
        if not page.get("has_more") or not last or last == query.get("after"):
            break
        query = {"limit": str(PAGE_SIZE), "after": last}
    return sorted(batches, key=lambda b: b.get("created_at") or 0, reverse=True)


# ---- what it prints -------------------------------------------------------------------------------


def _counts(batch: Batch) -> tuple[int, int, int]:
    """(lines done, lines failed, total); done counts the failed ones too."""
    counts = batch.get("request_counts") or {}
    completed, failed, total = (int(counts.get(k) or 0) for k in ("completed", "failed", "total"))
    return completed + failed, failed, total


def _done(done: int, total: int) -> str:
    return f"{done}/{total} ({done * 100 // total}%)" if total else f"{done}/{total}"


def progress_line(batch: Batch) -> str:
    done, failed, total = _counts(batch)
    filled = BAR_WIDTH * min(done, total) // total if total else 0
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {_done(done, total)}, {failed} failed"


def _when(timestamp: Any) -> str:
    if not isinstance(timestamp, int | float):
        return "-"
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def batch_table(batches: list[Batch]) -> str:
    rows = [("ID", "STATUS", "ENDPOINT", "MODEL", "DONE", "FAILED", "CREATED")]
    for batch in batches:
        done, failed, total = _counts(batch)
        rows.append((str(batch.get("id")), str(batch.get("status")), str(batch.get("endpoint") or "-"),
                     str(batch.get("model") or "-"), _done(done, total), str(failed), _when(batch.get("created_at"))))
    return _table(rows)


def describe(batch: Batch) -> str:
    rows = [("id", str(batch.get("id"))), ("status", str(batch.get("status"))),
            ("endpoint", str(batch.get("endpoint") or "-")), ("model", str(batch.get("model") or "-")),
            ("progress", progress_line(batch)), ("input file", str(batch.get("input_file_id") or "-")),
            ("output file", str(batch.get("output_file_id") or "-")),
            ("error file", str(batch.get("error_file_id") or "-"))]
    if batch.get("completion_window"):
        rows.append(("window", str(batch["completion_window"])))
    rows += [(name, _when(batch[key])) for name, key in MOMENTS if batch.get(key) is not None]
    for error in (batch.get("errors") or {}).get("data") or []:
        where = f"line {error['line']}: " if error.get("line") is not None else ""
        rows.append(("error", f"{where}{error.get('code') or 'error'}: {' '.join(str(error.get('message')).split())}"))
    for key, value in sorted((batch.get("metadata") or {}).items()):
        rows.append(("metadata", f"{key}={value}"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


# ---- the actions ----------------------------------------------------------------------------------


def list_batches(server: Server, as_json: bool) -> int:
    batches = fetch_all(server)
    if as_json:
        print(json.dumps({"object": "list", "data": batches, "first_id": batches[0]["id"] if batches else None,
                          "last_id": batches[-1]["id"] if batches else None, "has_more": False}, indent=2))
    elif not batches:
        print(f"No batch jobs on {server.url}.")
    else:
        print(batch_table(batches))
    return 0


def show(server: Server, batch_id: str, as_json: bool) -> int:
    batch = server.ask("GET", _path(batch_id))
    print(json.dumps(batch, indent=2) if as_json else describe(batch))
    return 0


def watch(server: Server, batch_id: str, as_json: bool) -> int:
    """Reads the batch every second until its status is final; on a terminal the reading replaces the
    last one, elsewhere (a pipe, a log) they follow each other (one JSON object a line with --json)."""
    redraw = sys.stdout.isatty() and not as_json
    try:
        while True:
            batch = server.ask("GET", _path(batch_id))
            if as_json:
                print(json.dumps(batch), flush=True)
            else:
                print(("\x1b[H\x1b[J" if redraw else "") + describe(batch) + ("" if redraw else "\n"), flush=True)
            if batch.get("status") in FINAL:
                return 0
            time.sleep(WATCH_EVERY)
    except KeyboardInterrupt:
        print()
        return 130


def cancel(server: Server, batch_id: str, as_json: bool) -> int:
    batch = server.ask("POST", _path(batch_id, "cancel"))
    print(json.dumps(batch, indent=2) if as_json else f"{batch.get('id')}: {batch.get('status')}")
    return 0
