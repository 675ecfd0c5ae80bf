"""The batch store and the runner's end of a job, without a model: exactly-once results, counts,
expiry, finalizing twice, one server per data folder."""

from __future__ import annotations

import asyncio
import json
import stat
import time
from pathlib import Path

import pytest

from swama.handlers.batch.input import batch_lines, check_upload
from swama.handlers.batch.runner import EXPIRED_MESSAGE, BatchRunner
from swama.handlers.batch.store import BatchStore, DataInUse, Line
from swama.handlers.http.errors import ApiError


def lines(n: int) -> list[Line]:
    return [Line(i + 1, f"c{i}", json.dumps({"model": "m", "input": "x"})) for i in range(n)]


def test_a_line_is_finished_once(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    batch = store.add_batch("/v1/embeddings", "file-x", "24h", lines(3), {"a": "b"}, "m", None)
    assert store.batch(batch)["status"] == "validating" and store.batch(batch)["total"] == 3
    assert store.finish_line(batch, 1, True, {"custom_id": "c0"}, (5, 0)) is True
    assert store.finish_line(batch, 1, False, {"custom_id": "c0", "again": True}, (9, 9)) is False  # done already
    assert store.finish_line(batch, 2, False, {"custom_id": "c1"}, (0, 0)) is True
    assert store.counts(batch) == {"completed": 1, "failed": 1, "pending": 1}
    assert [x.custom_id for x in store.pending(batch)] == ["c2"]
    assert [json.loads(x) for x in store.results(batch, True)] == [{"custom_id": "c0"}]
    assert store.usage(batch) == (5, 0)
    assert store.line_counts() == {"queued": 1, "finished": 2}
    store.close()
    reopened = BatchStore(tmp_path)  # what was committed is there after a restart
    assert reopened.counts(batch) == {"completed": 1, "failed": 1, "pending": 1}
    assert reopened.active() == [batch]
    reopened.close()


def test_one_server_per_data_folder(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    with pytest.raises(DataInUse, match="Another swama server uses the data folder"):
        BatchStore(tmp_path)
    store.close()
    BatchStore(tmp_path).close()


def test_the_data_folder_is_this_users_only(tmp_path: Path) -> None:
    root = tmp_path / "data"
    BatchStore(root).close()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700  # uploads, results and the job database inside


def test_files_are_reached_by_id_and_expire(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    kept = store.add_file(b"{}\n", "batch", "in.jsonl")
    gone = store.add_file(b"{}\n", "batch", "old.jsonl", expires_after=3600, now=int(time.time()) - 7200)
    assert store.file(kept["id"])["bytes"] == 3 and store.path_of(kept["id"]).read_bytes() == b"{}\n"
    assert store.file(gone["id"]) is None and not store.path_of(gone["id"]).exists()
    assert [f["id"] for f in store.files("batch")] == [kept["id"]]
    assert store.delete_file(kept["id"]) and store.file(kept["id"]) is None
    store.close()


def test_an_expired_job_answers_its_pending_lines_with_batch_expired(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    batch = store.add_batch("/v1/embeddings", "file-x", "24h", lines(3), None, "m", None)
    store.finish_line(batch, 1, True, {"custom_id": "c0"}, (1, 0))
    with store._tx() as db:  # the completion window has passed
        db.execute("UPDATE batches SET expires_at = ? WHERE id = ?", (int(time.time()) - 1, batch))

    async def run() -> None:
        runner = BatchRunner(app=None, store=store, lines_in_flight=2, api_key=None)  # type: ignore[arg-type]
        runner.submit(batch)
        await runner.wait(batch)

    asyncio.run(run())
    record = store.batch(batch)
    assert record["status"] == "expired" and record["expired_at"] is not None
    errors = [json.loads(x) for x in store.results(batch, False)]
    assert [e["custom_id"] for e in errors] == ["c1", "c2"]
    assert all(e["error"] == {"code": "batch_expired", "message": EXPIRED_MESSAGE} for e in errors)
    output = store.file(record["output_file_id"])
    assert output is not None and output["purpose"] == "batch_output"
    assert store.path_of(record["error_file_id"]).read_text().count("\n") == 2
    store.close()


def test_finalizing_again_after_a_crash_writes_the_same_files(tmp_path: Path) -> None:
    store = BatchStore(tmp_path)
    batch = store.add_batch("/v1/embeddings", "file-x", "24h", lines(2), None, "m", None)
    for i in (1, 2):
        store.finish_line(batch, i, True, {"custom_id": f"c{i - 1}"}, (1, 0))
    store.set_status(batch, "finalizing")  # killed while finalizing

    async def run() -> None:
        runner = BatchRunner(app=None, store=store, lines_in_flight=2, api_key=None)  # type: ignore[arg-type]
        await runner.start()  # resumes every job left unfinished
        await runner.wait(batch)

    asyncio.run(run())
    record = store.batch(batch)
    assert record["status"] == "completed"
    first = store.path_of(record["output_file_id"]).read_bytes()
    assert first.count(b"\n") == 2
    store.close()


def test_input_rules() -> None:
    check_upload(b'{"a": 1}\n\n{"b": 2}\n', "x.jsonl")
    for data, text in [(b"", "empty"), (b"{}\n[1]\n", "line 2 of 'x.jsonl' is not a JSON object"),
                       (b"{\n", "line 1 of 'x.jsonl' is not valid JSON")]:
        with pytest.raises(ApiError, match=text):
            check_upload(data, "x.jsonl")
    good = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": "x"}}
    found, model = batch_lines(json.dumps(good).encode(), "file-1", "/v1/embeddings")
    assert model == "m" and found[0].custom_id == "a" and json.loads(found[0].body) == good["body"]
    other = {**good, "custom_id": "b", "body": {"model": "n", "input": "y"}}
    assert batch_lines((json.dumps(good) + "\n" + json.dumps(other)).encode(), "f", "/v1/embeddings")[1] is None
    with pytest.raises(ApiError, match="holds no requests"):
        batch_lines(b"\n", "f", "/v1/embeddings")
    # A model that is no name (an object, a list) is the line's own route's to refuse when the job runs;
    # reading the file takes it (it was an unhashable TypeError, a 500).
    for odd in ({"x": 1}, [1], None, 3):
        found, model = batch_lines(json.dumps({**good, "body": {"model": odd, "input": "x"}}).encode(), "f",
                                   "/v1/embeddings")
        assert model is None and json.loads(found[0].body)["model"] == odd
