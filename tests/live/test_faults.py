"""Faults a server meets in the field: damaged model files, a model removed while in use, a client
that stops halfway through its body. Each gets a clear answer and leaves the server serving."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TINY_ID, install_folder

from live_server import LiveServer, start_server

BROKEN = "test/broken"
GONE = "test/gone"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("fault-store")
    for repo_id in (TINY_ID, BROKEN, GONE):
        install_folder(root, repo_id, tiny_model_dir)
    weights = root / BROKEN / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated, as by a full disk or a killed copy
    return root


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[LiveServer]:
    live = start_server(store, store.parent / "fault-server.log")
    yield live
    live.stop()


def _chat(server: LiveServer, model: str) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def test_a_damaged_model_is_a_clear_error_and_the_others_keep_serving(server: LiveServer) -> None:
    r = _chat(server, BROKEN)
    assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
    message = r.json()["error"]["message"]
    assert message.startswith(f"Model '{BROKEN}' could not be loaded: ") and "reinstall it" in message
    assert str(server.log.parent) not in message  # the store's folder is the server's to know
    assert _chat(server, BROKEN).status_code == 500  # tried again, not cached as half loaded
    assert _chat(server, TINY_ID).status_code == 200


def test_a_model_removed_while_loaded_is_gone_for_the_next_request(server: LiveServer, store: Path) -> None:
    assert _chat(server, GONE).status_code == 200  # loaded now
    out = subprocess.run([sys.executable, "-m", "swama.handlers.cli", "rm", "-f", GONE], capture_output=True,
                         text=True, env={"SWAMA_MODELS": str(store), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    r = _chat(server, GONE)
    assert r.status_code == 404 and r.json()["error"]["message"] == "The model is not available locally."
    assert GONE not in [m["id"] for m in httpx.get(server.v1 + "/models").json()["data"]]
    assert _chat(server, TINY_ID).status_code == 200


def test_a_client_that_stops_halfway_through_its_body_leaves_no_trace(server: LiveServer) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 500\r\n\r\n{\"model\": ")
        time.sleep(0.5)
    time.sleep(0.5)
    assert _chat(server, TINY_ID).status_code == 200
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log and "unhandled error" not in log


def test_files_missing_from_an_installed_model_are_reported_the_same_way(store: Path, tmp_path: Path,
                                                                         tiny_model_dir: Path) -> None:
    root = tmp_path / "store"
    folder = Path(install_folder(root, "test/partial", tiny_model_dir))
    (folder / "model.safetensors").unlink()
    live = start_server(root, tmp_path / "partial.log")
    try:
        r = _chat(live, "test/partial")
        assert r.status_code == 500 and "could not be loaded" in r.json()["error"]["message"]
    finally:
        live.stop()
    shutil.rmtree(root)
