"""Durable state of files and batch jobs: one SQLite database (WAL) and the file bodies beside it.

    <data>/batches.sqlite3     files, batches and one row per input line of every batch
    <data>/files/<file id>     each file's bytes, named only by ids this store made

A line's result (the output or error line, whole) is written in the same transaction that marks it
done, so a job killed at any point resumes with exactly the lines that are not done: none lost, none
answered twice. Output and error files are written from those rows when the job finalizes, under
ids fixed when the job was created, so finalizing again after a crash writes the same files.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL, expires_at INTEGER
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, endpoint TEXT NOT NULL, model TEXT, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    in_progress_at INTEGER, expires_at INTEGER, finalizing_at INTEGER, completed_at INTEGER,
    failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    output_file_id TEXT NOT NULL, error_file_id TEXT NOT NULL, errors TEXT, metadata TEXT,
    output_expires_seconds INTEGER,
    total INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, body TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending', result TEXT, input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, line)
);
CREATE INDEX IF NOT EXISTS lines_pending ON lines (batch_id, state);
"""

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # a job the runner still owes work
FINAL = ("completed", "failed", "expired", "cancelled")
WINDOW_SECONDS = {"24h": 24 * 3600}


class DataInUse(RuntimeError):
    pass


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


@dataclass(frozen=True)
class Line:
    line: int  # 1-based, as a user counts the lines of the input file
    custom_id: str
    body: str  # the request body as JSON text


class BatchStore:
    """Files and batches under `root`. Every method is short and thread-safe (one connection, one lock)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files_dir = root / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)  # uploads, results and the job database: this user's only
        # One server per data folder: two would both run its jobs.
        self._owner = open(root / "owner.lock", "w")  # noqa: SIM115 (held open while the store lives)
        try:
            fcntl.flock(self._owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._owner.close()
            raise DataInUse(f"Another swama server uses the data folder {root}; give this one its own with --data "
                            "(or SWAMA_DATA).") from None
        self._db = sqlite3.connect(root / "batches.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: a killed process loses no commit
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()
        self._owner.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self._lock)

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # -- files -------------------------------------------------------------------------------------

    def path_of(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def add_file(self, data: bytes, purpose: str, filename: str, expires_after: int | None = None,
                 file_id: str | None = None, now: int | None = None) -> dict[str, Any]:
        """Store `data` (written and synced before its row is committed) and return its record."""
        file_id = file_id or new_id("file-")
        now = int(time.time()) if now is None else now
        _write_whole(self.path_of(file_id), data)
        expires_at = now + expires_after if expires_after else None
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)",
                       (file_id, purpose, filename, len(data), now, expires_at))
        return {"id": file_id, "purpose": purpose, "filename": filename, "bytes": len(data), "created_at": now,
                "expires_at": expires_at}

    def stored_bytes(self) -> int:
        """The bytes of every file held (expired ones go when next read)."""
        return int(self._query("SELECT COALESCE(SUM(bytes), 0) AS total FROM files")[0]["total"])

    def file(self, file_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM files WHERE id = ?", (file_id,))
        if not rows:
            return None
        record = dict(rows[0])
        if record["expires_at"] is not None and record["expires_at"] <= time.time():
            self.delete_file(file_id)  # an expired file is gone, as if deleted
            return None
        return record

    def files(self, purpose: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT id FROM files", ()
        if purpose is not None:
            sql, args = sql + " WHERE purpose = ?", (purpose,)
        ids = [r["id"] for r in self._query(sql + " ORDER BY created_at, rowid", args)]
        return [f for f in map(self.file, ids) if f is not None]

    def delete_file(self, file_id: str) -> bool:
        with self._tx() as db:
            gone = db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0
        self.path_of(file_id).unlink(missing_ok=True)
        return gone

    # -- batches -----------------------------------------------------------------------------------

    def add_batch(self, endpoint: str, input_file_id: str, completion_window: str, lines: list[Line],
                  metadata: dict[str, str] | None, model: str | None, output_expires_seconds: int | None) -> str:
        """A new job in `validating`, its lines pending; the job and its lines in one transaction."""
        batch_id, now = new_id("batch_"), int(time.time())
        with self._tx() as db:
            db.execute(
                "INSERT INTO batches (id, endpoint, model, input_file_id, completion_window, status, created_at,"
                " expires_at, output_file_id, error_file_id, metadata, output_expires_seconds, total)"
                " VALUES (?, ?, ?, ?, ?, 'validating', ?, ?, ?, ?, ?, ?, ?)",
                (batch_id, endpoint, model, input_file_id, completion_window, now,
                 now + WINDOW_SECONDS[completion_window], new_id("file-"), new_id("file-"),
                 json.dumps(metadata) if metadata is not None else None, output_expires_seconds, len(lines)))
            db.executemany("INSERT INTO lines (batch_id, line, custom_id, body) VALUES (?, ?, ?, ?)",
                           [(batch_id, x.line, x.custom_id, x.body) for x in lines])
        return batch_id

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM batches WHERE id = ?", (batch_id,))
        return dict(rows[0]) if rows else None

    def batches(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._query("SELECT * FROM batches ORDER BY created_at DESC, rowid DESC")]

    def active(self) -> list[str]:
        marks = ",".join("?" * len(ACTIVE))
        return [r["id"] for r in self._query(f"SELECT id FROM batches WHERE status IN ({marks}) ORDER BY rowid",
                                             ACTIVE)]

    def set_status(self, batch_id: str, status: str, *, only_from: tuple[str, ...] | None = None,
                   errors: list[dict[str, Any]] | None = None) -> bool:
        """Move a job to `status`, stamping `<status>_at`; with `only_from`, only from those statuses."""
        now = int(time.time())
        sql = f"UPDATE batches SET status = ?, {status}_at = COALESCE({status}_at, ?)"
        args: list[Any] = [status, now]
        if errors is not None:
            sql += ", errors = ?"
            args.append(json.dumps(errors))
        sql += " WHERE id = ?"
        args.append(batch_id)
        if only_from:
            sql += f" AND status IN ({','.join('?' * len(only_from))})"
            args.extend(only_from)
        with self._tx() as db:
            return db.execute(sql, args).rowcount > 0

    def counts(self, batch_id: str) -> dict[str, int]:
        rows = self._query("SELECT state, COUNT(*) AS n FROM lines WHERE batch_id = ? GROUP BY state", (batch_id,))
        by = {r["state"]: r["n"] for r in rows}
        return {"completed": by.get("done", 0), "failed": by.get("failed", 0), "pending": by.get("pending", 0)}

    def usage(self, batch_id: str) -> tuple[int, int]:
        [row] = self._query("SELECT COALESCE(SUM(input_tokens), 0) AS i, COALESCE(SUM(output_tokens), 0) AS o "
                            "FROM lines WHERE batch_id = ?", (batch_id,))
        return row["i"], row["o"]

    def line_counts(self) -> dict[str, int]:
        """Lines of jobs still running that wait, and lines answered or failed in every job."""
        marks = ",".join("?" * len(ACTIVE))
        [row] = self._query(
            "SELECT COALESCE(SUM(l.state = 'pending' AND b.status IN (" + marks + ")), 0) AS queued,"
            " COALESCE(SUM(l.state != 'pending'), 0) AS finished"
            " FROM lines l JOIN batches b ON b.id = l.batch_id", ACTIVE)
        return {"queued": row["queued"], "finished": row["finished"]}

    def pending(self, batch_id: str) -> Iterator[Line]:
        for r in self._query("SELECT line, custom_id, body FROM lines WHERE batch_id = ? AND state = 'pending' "
                             "ORDER BY line", (batch_id,)):
            yield Line(r["line"], r["custom_id"], r["body"])

    def finish_line(self, batch_id: str, line: int, ok: bool, result: dict[str, Any], tokens: tuple[int, int]) -> bool:
        """A line's result and its completion, committed together; False if it was already done."""
        with self._tx() as db:
            return db.execute(
                "UPDATE lines SET state = ?, result = ?, input_tokens = ?, output_tokens = ? "
                "WHERE batch_id = ? AND line = ? AND state = 'pending'",
                ("done" if ok else "failed", json.dumps(result, ensure_ascii=False), *tokens, batch_id, line),
            ).rowcount > 0

    def results(self, batch_id: str, ok: bool) -> Iterator[str]:
        for r in self._query("SELECT result FROM lines WHERE batch_id = ? AND state = ? ORDER BY line",
                             (batch_id, "done" if ok else "failed")):
            yield r["result"]


class _Transaction:
    """`with store._tx() as db:` one IMMEDIATE transaction under the store's lock."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: Any, *_: Any) -> None:
        try:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.lock.release()


def _write_whole(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically: a temporary file, synced, then renamed over it."""
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

