"""Hostile bodies beyond what a schema generates, sent to a live server: nesting past any limit,
unterminated strings of escapes, numbers of thousands of digits, odd Unicode, bytes that are no JSON,
and compressed bodies (truncated, mislabelled, expanding far past the limit). Whatever comes, the answer
is a 4xx in the route's envelope, never a 5xx or a hang, and /health keeps answering between them.
Images and audio crafted the same way are fuzzed where they are checked and decoded
(tests/http/test_images.py, tests/engine/test_transcription.py)."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from live_server import LiveServer

EXAMPLES = 150  # per test; derandomized, so CI sends the same bodies every time
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/decisions", "/v1/systemone", "/v1/messages",
          "/v1/embeddings", "/v1/responses", "/v2/rerank"]
JSON = {"content-type": "application/json"}


def nested(depth: int, opener: str) -> str:
    closer = {"[": "]", "{": "}"}[opener]
    inner = '{"a": ' * depth + "1" + "}" * depth if opener == "{" else opener * depth + closer * depth
    return '{"model": "m", "messages": ' + inner + "}"


texts = st.one_of(
    st.builds(nested, st.integers(1, 20_000), st.sampled_from(["[", "{"])),
    st.builds(lambda n, open_: '{"model": "' + '\\"' * n + ('"}' if not open_ else ""), st.integers(1, 40_000),
              st.booleans()),
    st.builds(lambda digits, exp: '{"model": "m", "n": ' + "9" * digits + (f"e{exp}" if exp else "") + "}",
              st.integers(1, 20_000), st.integers(-10 ** 6, 10 ** 6)),
    st.builds(lambda s: json.dumps({"model": s, "messages": [{"role": "user", "content": s}]}, ensure_ascii=False),
              st.text(st.characters(codec="utf-8"), max_size=200)),
    st.builds(lambda s: '{"model": "' + s + '"}', st.sampled_from(["\\ud800", "\\udfff\\ud800", "\\u0000", "\\uffff",
                                                                  "\u202e", "\\x41", "\\", "\\u12"])),
)


@pytest.fixture(autouse=True)
def _health_stays_up(empty_server: LiveServer):
    yield
    assert httpx.get(empty_server.url + "/health", timeout=10).status_code == 200


def _answered(empty_server: LiveServer, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    r = httpx.post(empty_server.url + path, content=body, headers=headers, timeout=30)
    assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:300])
    assert r.json(), r.text[:300]  # an envelope, not a bare page
    return r


@given(text=texts, path=st.sampled_from(ROUTES))
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, derandomize=True)
def test_hostile_json_is_a_4xx(empty_server: LiveServer, text: str, path: str) -> None:
    _answered(empty_server, path, text.encode("utf-8", "surrogatepass"), JSON)


@given(data=st.binary(max_size=4096), path=st.sampled_from(ROUTES))
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, derandomize=True)
def test_bytes_that_are_no_json_are_a_4xx(empty_server: LiveServer, data: bytes, path: str) -> None:
    _answered(empty_server, path, data, JSON)


def _compressed(kind: str, body: bytes, cut: int) -> tuple[bytes, str]:
    packed = gzip.compress(body) if kind == "gzip" else zstandard.ZstdCompressor().compress(body)
    return (packed[:-cut] if cut else packed), kind


@given(text=texts, kind=st.sampled_from(["gzip", "zstd"]), cut=st.integers(0, 12), label=st.booleans(),
       path=st.sampled_from(ROUTES))
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, derandomize=True)
def test_compressed_bodies_are_a_4xx(empty_server: LiveServer, text: str, kind: str, cut: int, label: bool,
                                     path: str) -> None:
    body, encoding = _compressed(kind, text.encode("utf-8", "surrogatepass"), cut)
    # Labelled with the other encoding now and then: a body that is not what its header says.
    named = encoding if label else {"gzip": "zstd", "zstd": "gzip"}[encoding]
    _answered(empty_server, path, body, {**JSON, "content-encoding": named})
