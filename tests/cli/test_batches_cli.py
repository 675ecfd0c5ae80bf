"""`swama batches` against a small stand-in server that answers OpenAI's Batch API wire shapes: what
the command prints (the table over every page, the progress line, the cancel status, the raw JSON),
the header it sends, and its one-line errors. The thing tested is the command's HTTP handling and
formatting; the server's own batch routes are tested with the server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from swama.handlers.cli import batches as batches_cli
from swama.handlers.cli.main import MODEL_COMMANDS, main

CREATED = 1_700_000_000
PAGE = 2  # the stand-in answers at most two batches a page, whatever limit is asked


def batch(number: int, status: str = "in_progress", completed: int = 0, failed: int = 0, total: int = 0,
          **extra: Any) -> dict[str, Any]:
    return {"id": f"batch_{number}", "object": "batch", "endpoint": "/v1/chat/completions", "model": "smollm2",
            "errors": None, "input_file_id": f"file-in{number}", "completion_window": "24h", "status": status,
            "output_file_id": None, "error_file_id": None, "created_at": CREATED + number * 60,
            "in_progress_at": None, "expires_at": CREATED + 86_400, "finalizing_at": None, "completed_at": None,
            "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": total, "completed": completed, "failed": failed}, "metadata": None,
            **extra}


@dataclass
class Stub:
    """The stand-in's batches (newest first, as OpenAI lists them) and what it was asked."""

    url: str
    batches: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # method, path, headers
    # Successive answers for GET /v1/batches/{id}, for --watch; the last one repeats.
    readings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def find(self, batch_id: str) -> dict[str, Any] | None:
        return next((b for b in self.batches if b["id"] == batch_id), None)


def _handler(stub: Stub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def missing(self, batch_id: str) -> None:
            self.answer(404, {"error": {"message": f"No batch found with id '{batch_id}'.",
                                        "type": "invalid_request_error", "param": None, "code": None}})

        def do_GET(self) -> None:
            self.note()
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if url.path == "/v1/batches":
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                ids = [b["id"] for b in stub.batches]
                start = ids.index(query["after"]) + 1 if "after" in query else 0
                data = stub.batches[start:start + min(PAGE, int(query.get("limit", 20)))]
                self.answer(200, {"object": "list", "data": data,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None,
                                  "has_more": start + len(data) < len(stub.batches)})
            elif len(parts) == 3 and parts[:2] == ["v1", "batches"]:
                readings = stub.readings.get(parts[2])
                found = (readings.pop(0) if len(readings) > 1 else readings[0]) if readings else stub.find(parts[2])
                if found:
                    self.answer(200, found)
                else:
                    self.missing(parts[2])
            else:
                self.answer(404, {"error": {"message": f"no route {url.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            self.note()
            length = int(self.headers.get("Content-Length") or 0)
            assert not self.rfile.read(length)  # cancel has no body
            parts = urlsplit(self.path).path.strip("/").split("/")
            if len(parts) == 4 and parts[:2] == ["v1", "batches"] and parts[3] == "cancel":
                found = stub.find(parts[2])
                if found is None:
                    self.missing(parts[2])
                    return
                found["status"] = "cancelling"
                found["cancelling_at"] = CREATED + 3600
                self.answer(200, found)
            else:
                self.answer(404, {"error": {"message": "not found", "type": "not_found"}})

        def note(self) -> None:
            stub.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))

    return Handler


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    monkeypatch.delenv(batches_cli.API_KEY_ENV, raising=False)
    monkeypatch.delenv(batches_cli.URL_ENV, raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    state = Stub(f"http://127.0.0.1:{server.server_address[1]}")
    server.RequestHandlerClass = _handler(state)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def swama(stub: Stub, *args: str) -> int:
    return main(["batches", *args, "--url", stub.url])


def local(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def test_list_reads_every_page_and_prints_newest_first(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    stub.batches = [batch(3, "in_progress", completed=117, failed=3, total=200),
                    batch(2, "completed", completed=10, total=10, model=None),
                    batch(1, "validating")]
    assert swama(stub, "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "ENDPOINT", "MODEL", "DONE", "FAILED", "CREATED"]
    assert [line.split()[0] for line in lines[1:]] == ["batch_3", "batch_2", "batch_1"]
    assert lines[1].split() == ["batch_3", "in_progress", "/v1/chat/completions", "smollm2", "120/200", "(60%)", "3",
                                *local(CREATED + 180).split()]
    assert lines[2].split()[3:6] == ["-", "10/10", "(100%)"]  # no model: a dash
    assert lines[3].split()[4:6] == ["0/0", "0"]
    pages = [path for method, path, _ in stub.requests]
    assert pages == ["/v1/batches?limit=100", "/v1/batches?limit=100&after=batch_2"]
    # The columns line up.
    assert len({line.index("/v1/") for line in lines[1:]}) == 1


def test_batches_alone_lists_them(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    assert swama(stub) == 0
    assert capsys.readouterr().out.strip() == f"No batch jobs on {stub.url}."
    stub.batches = [batch(1)]
    assert main(["batches", "--url", stub.url + "/v1/"]) == 0  # an OpenAI base URL names the same server
    assert capsys.readouterr().out.splitlines()[1].startswith("batch_1 ")


def test_list_json_is_every_batch_in_one_list(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    stub.batches = [batch(3), batch(2), batch(1)]
    assert swama(stub, "list", "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"object": "list", "data": stub.batches, "first_id": "batch_3", "last_id": "batch_1",
                       "has_more": False}


def test_show_prints_the_fields_and_a_progress_line(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    stub.batches = [batch(7, "in_progress", completed=117, failed=3, total=200, in_progress_at=CREATED + 430,
                          output_file_id="file-out7", metadata={"job": "nightly"})]
    assert swama(stub, "show", "batch_7") == 0
    out = capsys.readouterr().out
    rows = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}
    assert rows["progress"] == "[#########.......] 120/200 (60%), 3 failed"
    assert rows["status"] == "in_progress" and rows["model"] == "smollm2"
    assert rows["endpoint"] == "/v1/chat/completions"
    assert rows["input file"] == "file-in7" and rows["output file"] == "file-out7" and rows["error file"] == "-"
    assert rows["created"] == local(CREATED + 420) and rows["in progress"] == local(CREATED + 430)
    assert rows["metadata"] == "job=nightly"
    assert "completed" not in rows  # moments that have not happened are left out


def test_show_json_prints_the_servers_object(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    stub.batches = [batch(7, total=5)]
    assert swama(stub, "--json", "show", "batch_7") == 0  # the flag may stand before the action too
    assert json.loads(capsys.readouterr().out) == stub.batches[0]


def test_watch_reads_until_the_batch_is_final(stub: Stub, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches_cli, "WATCH_EVERY", 0.01)
    stub.readings["batch_4"] = [batch(4, "in_progress", completed=1, total=4),
                                batch(4, "finalizing", completed=4, total=4),
                                batch(4, "completed", completed=4, total=4, output_file_id="file-out4")]
    assert swama(stub, "show", "batch_4", "--watch") == 0
    out = capsys.readouterr().out
    assert out.count("\nprogress ") == 3
    assert "[####............] 1/4 (25%), 0 failed" in out and "[################] 4/4 (100%), 0 failed" in out
    assert len(stub.requests) == 3  # it stopped at the final status


def test_ctrl_c_ends_watching_with_130(stub: Stub, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    stub.batches = [batch(5, total=3)]

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(batches_cli.time, "sleep", interrupted)
    assert swama(stub, "show", "batch_5", "--watch") == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err and "progress" in captured.out


def test_cancel_posts_and_prints_the_new_status(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    stub.batches = [batch(9, total=3)]
    assert swama(stub, "cancel", "batch_9") == 0
    assert capsys.readouterr().out.strip() == "batch_9: cancelling"
    assert [(method, path) for method, path, _ in stub.requests] == [("POST", "/v1/batches/batch_9/cancel")]
    assert swama(stub, "cancel", "batch_9", "--json") == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelling"


def test_an_unknown_id_prints_the_servers_message(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    for action in ("show", "cancel"):
        assert swama(stub, action, "batch_nope") == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == "error: No batch found with id 'batch_nope'. (HTTP 404)\n"


def test_the_api_key_is_sent_as_a_bearer_token(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    stub.batches = [batch(1)]
    assert swama(stub, "show", "batch_1") == 0
    assert "authorization" not in stub.requests[-1][2]
    assert swama(stub, "show", "batch_1", "--api-key", "sk-flag") == 0
    assert stub.requests[-1][2]["authorization"] == "Bearer sk-flag"
    monkeypatch.setenv(batches_cli.API_KEY_ENV, "sk-env")
    assert swama(stub, "list") == 0
    assert stub.requests[-1][2]["authorization"] == "Bearer sk-env"


def test_the_url_may_come_from_the_environment(stub: Stub, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(batches_cli.URL_ENV, stub.url)
    assert main(["batches", "list"]) == 0
    assert stub.requests and "No batch jobs" in capsys.readouterr().out


def test_an_unreachable_server_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as free:  # a port nothing listens on once it is closed
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"
    assert main(["batches", "list", "--url", url]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith(f"error: no swama server answers at {url} (")
    assert line.endswith("start it with: swama serve")


def test_every_request_is_bounded(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    timeouts: list[float] = []
    real = batches_cli.urllib.request.urlopen

    def urlopen(request: Any, timeout: float) -> Any:
        timeouts.append(timeout)
        return real(request, timeout=timeout)

    monkeypatch.setattr(batches_cli.urllib.request, "urlopen", urlopen)
    stub.batches = [batch(3), batch(2), batch(1)]
    assert swama(stub, "list") == 0 and swama(stub, "show", "batch_1") == 0 and swama(stub, "cancel", "batch_1") == 0
    assert timeouts == [10.0] * 4


def test_each_action_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    for action in ("list", "show", "cancel"):
        with pytest.raises(SystemExit) as done:
            main(["batches", action, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert f"usage: swama batches {action}" in out and "--url" in out and "--api-key" in out and "--json" in out
    with pytest.raises(SystemExit):
        main(["batches", "show", "--help"])
    assert "--watch" in capsys.readouterr().out


def test_batches_is_not_a_model_command_and_loads_no_mlx(stub: Stub) -> None:
    assert "batches" not in MODEL_COMMANDS
    code = ("import sys; from swama.handlers.cli.main import main; "
            f"assert main(['batches', '--url', {stub.url!r}]) == 0; "
            "assert not [m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')], 'mlx imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "No batch jobs" in done.stdout
