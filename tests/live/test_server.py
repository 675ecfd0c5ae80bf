"""The real server on a loopback port: routes, the merged spec, documented errors for bad input."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import zstandard

from live_server import LiveServer, read_http_answer, start_server

CLEF_ROUTES = [f"{prefix}/accounts/{{account_id}}/ai/run/@cf/cloudflare/{model}"
               for prefix in ("/client/v4", "") for model in ("clef", "clef-flash")]
POST_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings",
               "/v1/audio/transcriptions", "/v1/audio/speech", "/v1/decisions", "/v1/systemone",
               *(route.replace("{account_id}", "acct") for route in CLEF_ROUTES),
               # vLLM's tokenizer routes (their own spec document), answered in the OpenAI envelope.
               "/tokenize", "/detokenize",
               # Anthropic's Messages API, answered in Anthropic's envelope.
               "/v1/messages", "/v1/messages/count_tokens",
               # Cohere's rerank wire, answered in Cohere's envelope; vLLM's score route, in OpenAI's.
               "/v1/rerank", "/v2/rerank", "/v1/score"]
ANTHROPIC_ROUTES = {"/v1/messages", "/v1/messages/count_tokens"}
COHERE_ROUTES = {"/v1/rerank", "/v2/rerank"}
OPENAI_ROUTES = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings",
                 "/v1/audio/transcriptions", "/v1/audio/speech", "/tokenize", "/detokenize", "/v1/score"}
JSON = {"content-type": "application/json"}
MiB = 1024 * 1024


def assert_error_shape(path: str, response: httpx.Response) -> str:
    body = response.json()
    if "/ai/run/" in path:  # Cloudflare's v4 envelope
        assert body["result"] is None and body["success"] is False and body["messages"] == []
        (error,) = body["errors"]
        assert set(error) == {"code", "message"} and isinstance(error["code"], int)
        return error["message"]
    if path in COHERE_ROUTES:
        assert set(body) == {"message"} and isinstance(body["message"], str)
        return body["message"]
    if path in ANTHROPIC_ROUTES:
        assert set(body) == {"type", "error"} and body["type"] == "error" and set(body["error"]) == {"message", "type"}
        kinds = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 413: "request_too_large", 415: "invalid_request_error"}
        assert body["error"]["type"] == kinds[response.status_code]
        return body["error"]["message"]
    if path in OPENAI_ROUTES:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        assert isinstance(body["error"]["code"], str)
    elif path == "/v1/decisions":
        assert body == {"error": {"message": body["error"]["message"], "type": body["error"]["type"]}}
    else:
        assert set(body) == {"error", "detail"} and set(body["error"]) == {"message", "type"}
        assert body["detail"] == {"error_type": body["error"]["type"], "message": body["error"]["message"]}
    assert body["error"]["type"] == ("invalid_request_error" if response.status_code < 500 else
                                     body["error"]["type"])
    return body["error"]["message"]


def test_openapi_lists_every_operation(empty_server: LiveServer) -> None:
    spec = httpx.get(empty_server.url + "/openapi.json").json()
    ops = {(m.upper(), p) for p, item in spec["paths"].items() for m in item}
    files_and_batches = {("POST", "/v1/files"), ("GET", "/v1/files"), ("GET", "/v1/files/{file_id}"),
                         ("DELETE", "/v1/files/{file_id}"), ("GET", "/v1/files/{file_id}/content"),
                         ("POST", "/v1/batches"), ("GET", "/v1/batches"), ("GET", "/v1/batches/{batch_id}"),
                         ("POST", "/v1/batches/{batch_id}/cancel")}
    assert ops == {("GET", "/v1/models")} | {("POST", p.replace("acct", "{account_id}")) for p in POST_ROUTES} \
        | files_and_batches
    assert spec["openapi"] == "3.1.0"


def test_models_is_an_openai_list(empty_server: LiveServer) -> None:
    assert httpx.get(empty_server.v1 + "/models").json() == {"object": "list", "data": [], "models": []}


@pytest.mark.parametrize("path", POST_ROUTES)
@pytest.mark.parametrize("body", [b"{bad", b"", b"[1, 2]", b'{"model": NaN}', b"\xff\xfe"])
def test_bad_json_gets_the_documented_4xx(empty_server: LiveServer, path: str, body: bytes) -> None:
    headers = {"content-type": "application/json"}
    if path == "/v1/audio/transcriptions":
        headers = {"content-type": "multipart/form-data; boundary=x"}
    r = httpx.post(empty_server.url + path, content=body, headers=headers)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert_error_shape(path, r)


@pytest.mark.parametrize("path", [p for p in POST_ROUTES if p != "/v1/audio/transcriptions"])
def test_wrong_types_get_400(empty_server: LiveServer, path: str) -> None:
    r = httpx.post(empty_server.url + path, json={"model": 12, "input": {"x": 1}, "messages": 3})
    assert r.status_code == 400, r.text
    assert_error_shape(path, r)


def test_transcription_needs_multipart(empty_server: LiveServer) -> None:
    r = httpx.post(empty_server.v1 + "/audio/transcriptions", json={"model": "whisper"})
    assert r.status_code == 415
    assert assert_error_shape("/v1/audio/transcriptions", r) == (
        "POST /v1/audio/transcriptions reads only multipart/form-data bodies: send 'Content-Type: multipart/form-data' "
        "(got 'application/json').")


def test_a_request_cannot_widen_the_servers_limits(empty_server: LiveServer) -> None:
    many = httpx.post(empty_server.v1 + "/completions", json={"model": "m", "prompt": ["a"] * 65, "n": 2})
    assert many.status_code == 400 and "at most 128 completions" in many.json()["error"]["message"]
    wide = httpx.post(empty_server.v1 + "/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "context_limit": 10 ** 9})
    assert wide.status_code == 400 and wide.json()["error"]["code"] == "context_limit_exceeded"
    assert "at most the server's context limit" in wide.json()["error"]["message"]


def test_unknown_field_named_on_decisions(empty_server: LiveServer) -> None:
    r = httpx.post(empty_server.v1 + "/decisions", json={
        "model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "i", "zz": 1}]})
    assert r.status_code == 400
    assert "zz" in assert_error_shape("/v1/decisions", r)


def test_systemone_body_limit_and_duplicates(empty_server: LiveServer) -> None:
    url = empty_server.v1 + "/systemone"
    r = httpx.post(url, content=b" " * (13 * MiB + 1), headers=JSON)
    assert r.status_code == 413
    assert assert_error_shape("/v1/systemone", r) == "The request body is larger than 13 MiB."
    assert r.headers["x-typesafe-request-id"].startswith("systemone-")
    r = httpx.post(url, content=b" " * (13 * MiB), headers=JSON)  # exactly at the limit: parsed, then refused as invalid
    assert r.status_code == 400
    r = httpx.post(url, content=b'{"model":"m","state":"x","questions":{"a":{},"a":{}}}', headers=JSON)
    assert r.status_code == 400
    assert assert_error_shape("/v1/systemone", r) == "Duplicate SystemOne object key 'a'."
    r = httpx.post(url, content=b'{"model":"m","state":"x","questions":{"q":{"type":"noul","instructions":"i",'
                                b'"criteria":{"true":{"k":1,"\\u006b":2}}}}}', headers=JSON)
    assert r.status_code == 400 and "'k'" in assert_error_shape("/v1/systemone", r)


def test_zstd_bodies_are_decoded(empty_server: LiveServer) -> None:
    body = json.dumps({"model": "m", "state": "x", "questions": {"q": {"type": "noul", "instructions": "i",
                                                                        "bogus": 1}}}).encode()
    r = httpx.post(empty_server.v1 + "/systemone", content=zstandard.ZstdCompressor().compress(body),
                   headers={"content-encoding": "zstd", "content-type": "application/json"})
    assert r.status_code == 400 and "bogus" in assert_error_shape("/v1/systemone", r)
    r = httpx.post(empty_server.v1 + "/systemone", content=b"not zstd",
                   headers={"content-encoding": "zstd", **JSON})
    assert r.status_code == 400


def test_a_zstd_frame_claiming_a_tebibyte_is_a_400(empty_server: LiveServer) -> None:
    """A 17-byte zstd frame whose header claims 1 TiB of content: decoded block by block, it ends in a
    clear 400 (decompressing it in one call allocated the claimed size first: a MemoryError, a 500)."""
    data = b"{}"
    frame = (bytes.fromhex("28b52ffd") + bytes([0xE0]) + (2 ** 40).to_bytes(8, "little")
             + ((len(data) << 3) | 1).to_bytes(3, "little") + data)  # single segment, 8-byte size, one raw block
    r = httpx.post(empty_server.v1 + "/chat/completions", content=frame,
                   headers={"content-encoding": "zstd", "content-type": "application/json"})
    assert r.status_code == 400 and "zstd" in r.json()["error"]["message"], r.text


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's peak memory from /proc")
def test_a_gzip_bomb_stops_at_the_body_limit_without_inflating_it(empty_server: LiveServer) -> None:
    """Eight gzip members of 256 MiB of zeros each (2 GiB inflated, 2 MB sent): inflating stops as
    the output passes the route's 64 MiB, so the server's peak memory grows by far less than the bomb
    (inflating it whole, as before, raised the peak by the full 2 GiB)."""
    member = gzip.compress(bytes(256 * MiB), compresslevel=1)
    before = _peak_rss(empty_server.process.pid)
    r = httpx.post(empty_server.v1 + "/chat/completions", content=member * 8, timeout=120,
                   headers={"content-encoding": "gzip", "content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert _peak_rss(empty_server.process.pid) - before < 512 * MiB
    truncated = httpx.post(empty_server.v1 + "/chat/completions", content=gzip.compress(b"{}")[:-9],
                           headers={"content-encoding": "gzip", "content-type": "application/json"})
    assert truncated.status_code == 400 and "gzip" in truncated.json()["error"]["message"]


def test_chat_with_a_model_that_is_not_installed_is_404(empty_server: LiveServer) -> None:
    r = httpx.post(empty_server.v1 + "/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404
    assert assert_error_shape("/v1/chat/completions", r) == "The model is not available locally."


def test_unknown_paths_and_methods(empty_server: LiveServer) -> None:
    r = httpx.get(empty_server.v1 + "/nothing-here")
    assert r.status_code == 404 and "nothing-here" in r.json()["error"]["message"]
    r = httpx.get(empty_server.v1 + "/chat/completions")
    assert r.status_code == 405 and "GET" in r.json()["error"]["message"]


def test_api_key_is_enforced_when_configured(tmp_path) -> None:
    server = start_server(tmp_path, tmp_path / "log", "--api-key", "sekret")
    try:
        assert httpx.get(server.v1 + "/models").status_code == 401
        assert httpx.get(server.v1 + "/models", headers={"authorization": "Bearer nope"}).status_code == 401
        ok = httpx.get(server.v1 + "/models", headers={"authorization": "Bearer sekret"})
        assert ok.status_code == 200
        r = httpx.post(server.v1 + "/systemone", json={})
        assert r.status_code == 401 and set(r.json()) == {"error", "detail"}
    finally:
        server.stop()


def test_systemone_401_is_an_authentication_error(tmp_path) -> None:
    server = start_server(tmp_path, tmp_path / "log", "--api-key", "sekret")
    try:
        body = {"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}}}
        for headers in ({}, {"authorization": "Bearer nope"}):
            r = httpx.post(server.v1 + "/systemone", json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.headers["x-typesafe-request-id"].startswith("systemone-")
            message = "Missing or wrong API key: send 'Authorization: Bearer <key>'."
            assert r.json() == {"error": {"message": message, "type": "authentication_error"},
                                "detail": {"error_type": "authentication_error", "message": message}}
        r = httpx.post(server.v1 + "/systemone", json=body, headers={"authorization": "Bearer sekret"})
        assert r.status_code == 404  # past the key check: no model is installed
    finally:
        server.stop()


def test_cli_help_explains_itself() -> None:
    out = subprocess.run([sys.executable, "-m", "swama.handlers.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "serve" in out.stdout
    out = subprocess.run([sys.executable, "-m", "swama.handlers.cli", "serve", "--help"], capture_output=True,
                         text=True)
    assert "--host" in out.stdout and "127.0.0.1" in out.stdout and "SWAMA_PORT" in out.stdout


def test_binding_all_interfaces_warns(tmp_path) -> None:
    server = start_server(tmp_path, tmp_path / "log", "--host", "0.0.0.0")
    try:
        assert httpx.get(server.v1 + "/models").status_code == 200
    finally:
        server.stop()
    assert "exposes the API" in (tmp_path / "log").read_text()


def test_env_port_and_host_defaults(tmp_path) -> None:
    from swama.handlers.http.settings import ServerSettings as Settings

    assert Settings().host == "127.0.0.1" and Settings().port == 28100
    import os

    old = dict(os.environ)
    try:
        os.environ.update(SWAMA_HOST="127.0.0.2", SWAMA_PORT="28999")
        assert (Settings().host, Settings().port) == ("127.0.0.2", 28999)
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_an_idle_connection_outlives_the_clients_keep_alive(empty_server: LiveServer) -> None:
    """httpx (under the openai and anthropic SDKs) reuses an idle connection for 5 s: the server keeps
    it longer, so a request sent as the client's clock runs out is never met by a closing socket."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(empty_server.url)
    ask = f"GET /health HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as conn:
        for _ in range(2):
            conn.sendall(ask)
            reply = read_http_answer(conn)
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
            time.sleep(6)  # longer than the clients' 5 s, and uvicorn's own default
