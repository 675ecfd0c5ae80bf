"""What a web page can make of a server on the same machine: JSON routes read only JSON-labelled
bodies (a page's text/plain POST needs no CORS preflight), the Host header must name the server (DNS
rebinding), a page of another origin is refused unless --cors-origins lists it, and with --api-key
the operational routes need the key while /health says only that the server is up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from live_server import LiveServer, start_server

KEY = "sekrit"
LISTED = "http://localhost:3000"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("origins-store")
    live = start_server(root, root / "origins.log", "--api-key", KEY, "--allowed-hosts", "swama.test,*.lan.test",
                        "--cors-origins", LISTED, env={"SWAMA_API_KEY": KEY})
    yield live
    live.stop()


@pytest.fixture(scope="module")
def everywhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Listening on every address (the URL still dials 127.0.0.1)."""
    root = tmp_path_factory.mktemp("origins-any-store")
    live = start_server(root, root / "origins-any.log", "--host", "0.0.0.0")
    yield live
    live.stop()


def _auth(**headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}", **headers}


def _port(server: LiveServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _chat(server: LiveServer, **headers: str) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", headers=_auth(**headers), timeout=30,
                      content=b'{"model": "none/such", "messages": [{"role": "user", "content": "hi"}]}')


@pytest.mark.parametrize("given", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_json_route_reads_only_a_json_body(server: LiveServer, given: str | None) -> None:
    r = _chat(server, **({"content-type": given} if given else {}))
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_media_type" and "Content-Type: application/json" in error["message"]
    labelled = _chat(server, **{"content-type": "application/json; charset=utf-8"})
    assert labelled.status_code == 404  # read, and refused for its model


def test_the_refusal_comes_in_each_familys_envelope(server: LiveServer) -> None:
    messages = httpx.post(server.v1 + "/messages", content=b"{}", headers=_auth(**{"content-type": "text/plain"}))
    assert messages.status_code == 415 and messages.json()["type"] == "error"
    upload = httpx.post(server.v1 + "/files", json={"purpose": "batch"}, headers=_auth())
    assert upload.status_code == 415 and "multipart/form-data" in upload.json()["error"]["message"]


@pytest.mark.parametrize("host,status", [
    ("127.0.0.1:{port}", 200), ("localhost:{port}", 200), ("[::1]:{port}", 200), ("app.localhost:{port}", 200),
    ("swama.test:{port}", 200), ("box.lan.test", 200),
    ("attacker.example:{port}", 400), ("swama.test.attacker.example", 400), ("lan.test", 400), ("10.0.0.7", 400)])
def test_the_host_header_must_name_this_server(server: LiveServer, host: str, status: int) -> None:
    r = httpx.get(server.v1 + "/models", headers=_auth(host=host.format(port=_port(server))))
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["code"] == "invalid_host" and "--allowed-hosts" in r.json()["error"]["message"]


def test_listening_on_every_address_takes_any_ip_but_only_local_names(everywhere: LiveServer) -> None:
    for host in ("192.168.1.20:28100", "10.0.0.7", "[fe80::1]:28100", "localhost"):
        assert httpx.get(everywhere.v1 + "/models", headers={"host": host}).status_code == 200, host
    refused = httpx.get(everywhere.v1 + "/models", headers={"host": "rebound.attacker.example"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_host"


def test_a_page_of_another_origin_is_refused_unless_listed(server: LiveServer) -> None:
    other = _chat(server, **{"content-type": "application/json", "origin": "http://attacker.example"})
    assert other.status_code == 403 and other.json()["error"]["code"] == "cross_origin"
    assert "--cors-origins" in other.json()["error"]["message"]
    for origin in (f"http://127.0.0.1:{_port(server)}", LISTED):  # its own page, and the listed one
        r = _chat(server, **{"content-type": "application/json", "origin": origin})
        assert r.status_code == 404, (origin, r.text)
    listed = _chat(server, **{"content-type": "application/json", "origin": LISTED})
    assert listed.headers["access-control-allow-origin"] == LISTED
    same_host_other_port = _chat(server, **{"content-type": "application/json", "origin": "http://127.0.0.1:1"})
    assert same_host_other_port.status_code == 403


def test_preflights_are_answered_for_listed_origins_only(server: LiveServer) -> None:
    ask = {"access-control-request-method": "POST", "access-control-request-headers": "authorization,content-type"}
    listed = httpx.options(server.v1 + "/chat/completions", headers={"origin": LISTED, **ask})
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == LISTED
    other = httpx.options(server.v1 + "/chat/completions", headers={"origin": "http://attacker.example", **ask})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_with_a_key_the_operational_routes_need_it_and_health_says_only_up(server: LiveServer) -> None:
    for path in ("/metrics", "/openapi.json"):
        refused = httpx.get(server.url + path)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", path
        assert httpx.get(server.url + path, headers=_auth()).status_code == 200, path
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    full = httpx.get(server.url + "/health", headers=_auth()).json()
    assert full["status"] == "ok" and "version" in full and "models_loaded" in full
    page = httpx.get(server.url + "/")  # the playground's static page: it holds no data of its own
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]


def test_the_rules_are_in_the_served_document(server: LiveServer) -> None:
    rules = httpx.get(server.url + "/openapi.json", headers=_auth()).json()["info"]["description"]
    for fragment in ("415", "--allowed-hosts", "--cors-origins", "/health", "--api-key"):
        assert fragment in rules


def test_bad_settings_are_refused_at_start(tmp_path: Path) -> None:
    for flags in (("--allowed-hosts", "a.*.test"), ("--cors-origins", "localhost:3000"),
                  ("--cors-origins", "http://x.test/path")):
        with pytest.raises(RuntimeError, match="exited early"):
            start_server(tmp_path, tmp_path / "bad.log", *flags)
