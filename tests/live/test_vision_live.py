"""Images end to end on a real server over tiny vision models (Qwen3.5 and Gemma 3 families),
through the clients users run: the openai SDK (chat, responses, decisions), the typesafe-sdk and raw
HTTP with Clef's `images` (systemone), and `swama run -i`. Also every image rule through the routes,
with real crafted files."""

from __future__ import annotations

import base64
import http.server
import io
import os
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import typesafe_sdk
from conftest import TINY_ID, install_folder
from PIL import Image
from typesafe_sdk import Noul, TypeSafeClient

from live_server import LiveServer, free_port, start_server

pytestmark = pytest.mark.slow

QWEN_VL = "test/tiny-qwen3_5-vl"
GEMMA_VL = "test/tiny-gemma3-vl"
VISION_MODELS = (QWEN_VL, GEMMA_VL)
NO_VISION = "Images are not supported by this model; it has no vision processor."


def encoded(image: Image.Image, kind: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, kind)
    return out.getvalue()


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


PNG = encoded(noise(96, 64))
JPEG = encoded(noise(64, 96, seed=1), "JPEG")
WEBP = encoded(noise(80, 80, seed=2), "WEBP")


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def huge_header_png(width: int = 5000, height: int = 4000) -> bytes:
    """A complete, tiny PNG whose header claims 5000x4000 pixels (the body would not decode)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def vision_store(tiny_vision_dirs: dict[str, Path], tiny_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vision-store")
    install_folder(root, QWEN_VL, tiny_vision_dirs["qwen3_5_vl"])
    install_folder(root, GEMMA_VL, tiny_vision_dirs["gemma3_vl"])
    install_folder(root, TINY_ID, tiny_model_dir)
    return root


@pytest.fixture(scope="module")
def vision_server(vision_store: Path) -> Iterator[LiveServer]:
    root = vision_store
    # The image host below is on loopback, which only --allow-private-urls lets the server fetch from.
    server = start_server(root, root.parent / "vision-server.log", "--allow-private-urls")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(vision_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=vision_server.v1, api_key="local", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    """A loopback HTTP server: /cat.png, /cat.jpg, /missing, /to-file (a redirect to file://),
    /to-png (a redirect to /cat.png) and /big.png (over 4 MiB)."""
    routes = {"/cat.png": PNG, "/cat.jpg": JPEG, "/big.png": b"\x89PNG\r\n\x1a\n" + b"\0" * (5 * 1024 * 1024)}
    redirects = {"/to-file": "file:///etc/passwd", "/to-png": "/cat.png"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path in redirects:
                self.send_response(302)
                self.send_header("Location", redirects[self.path])
                self.end_headers()
                return
            body = routes.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            try:
                self.wfile.write(body or b"")
            except (BrokenPipeError, ConnectionResetError):  # the server stops reading past 4 MiB
                pass

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def chat_parts(*urls: str, text: str = "What is in the picture?") -> list[dict]:
    return [*({"type": "image_url", "image_url": {"url": u}} for u in urls), {"type": "text", "text": text}]


# -- chat completions -------------------------------------------------------------------------------

@pytest.mark.parametrize("model", VISION_MODELS)
def test_chat_with_images_through_the_openai_sdk(client: openai.OpenAI, model: str) -> None:
    plain = client.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "What is in the picture?"}])
    r = client.chat.completions.create(model=model, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": chat_parts(data_url(PNG), data_url(JPEG, "image/jpeg"))}])
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens  # the image tokens count
    again = client.chat.completions.create(model=model, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": chat_parts(data_url(PNG), data_url(JPEG, "image/jpeg"))}])
    assert again.choices[0].message.content == r.choices[0].message.content


def test_chat_streams_with_images(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=QWEN_VL, max_tokens=5, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": chat_parts(data_url(WEBP, "image/webp"))}])
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens >= 1


def test_chat_fetches_http_images(client: openai.OpenAI, image_host: str) -> None:
    local = client.chat.completions.create(model=QWEN_VL, max_tokens=3, temperature=0, messages=[
        {"role": "user", "content": chat_parts(data_url(PNG))}])
    remote = client.chat.completions.create(model=QWEN_VL, max_tokens=3, temperature=0, messages=[
        {"role": "user", "content": chat_parts(image_host + "/cat.png")}])
    redirected = client.chat.completions.create(model=QWEN_VL, max_tokens=3, temperature=0, messages=[
        {"role": "user", "content": chat_parts(image_host + "/to-png")}])
    assert remote.choices[0].message.content == local.choices[0].message.content
    assert redirected.usage.prompt_tokens == local.usage.prompt_tokens


def _chat_error(server: LiveServer, model: str, content: list[dict]) -> tuple[int, dict]:
    r = httpx.post(server.v1 + "/chat/completions", timeout=60,
                   json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": content}]})
    return r.status_code, r.json().get("error", {})


@pytest.mark.parametrize(("url", "message"), [
    ("file:///etc/passwd", "Invalid image URL"),
    ("ftp://example.com/cat.png", "Invalid image URL"),
    ("{host}/to-file", "messages.0.content.0 redirects to a URL that is not http or https."),
    ("{host}/missing", "messages.0.content.0 could not be fetched."),
    ("http://127.0.0.1:{closed}/cat.png", "messages.0.content.0 could not be fetched."),  # reads as a 404 does
    ("http://name.invalid/cat.png", "messages.0.content.0 could not be fetched."),
    ("{host}/big.png", "messages.0.content.0 is larger than 4 MiB."),
])
def test_chat_refuses_bad_image_urls(vision_server: LiveServer, image_host: str, url: str, message: str) -> None:
    status, error = _chat_error(vision_server, QWEN_VL, chat_parts(url.format(host=image_host, closed=free_port())))
    assert (status, error["message"]) == (400, message)


def test_without_the_setting_private_addresses_are_not_fetched(vision_store: Path, image_host: str) -> None:
    strict = start_server(vision_store, vision_store.parent / "vision-strict.log")
    try:
        for url in (f"{image_host}/cat.png", "http://localhost/cat.png", "http://169.254.169.254/latest/meta-data",
                    "http://[::1]/cat.png", "http://10.1.2.3/cat.png"):
            status, error = _chat_error(strict, QWEN_VL, chat_parts(url))
            assert status == 400 and "--allow-private-urls" in error["message"], (url, error)
    finally:
        strict.stop()


def test_images_on_a_text_model_are_refused_by_every_route(vision_server: LiveServer) -> None:
    status, error = _chat_error(vision_server, TINY_ID, chat_parts(data_url(PNG)))
    assert (status, error["message"]) == (400, NO_VISION)
    r = httpx.post(vision_server.v1 + "/responses", timeout=60, json={"model": TINY_ID, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG)}]}]})
    assert (r.status_code, r.json()["error"]["message"]) == (400, NO_VISION)
    r = httpx.post(vision_server.v1 + "/decisions", timeout=60, json={"model": TINY_ID, "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG)}]}],
        "questions": [{"type": "predicate", "instructions": "Is it a cat?"}]})
    assert (r.status_code, r.json()["error"]["message"]) == (400, NO_VISION)
    r = httpx.post(vision_server.v1 + "/systemone", timeout=60, json={
        "model": TINY_ID, "state": "x", "images": [data_url(PNG)],
        "questions": {"q": {"type": "noul", "instructions": "Is it a cat?"}}})
    assert (r.status_code, r.json()["error"]["message"]) == (400, NO_VISION)


def test_chat_context_limit_counts_image_tokens(vision_server: LiveServer) -> None:
    big = data_url(encoded(Image.new("RGB", (1000, 1000), (200, 100, 50))))  # ~960 image tokens
    r = httpx.post(vision_server.v1 + "/chat/completions", timeout=60, json={
        "model": QWEN_VL, "max_tokens": 2, "context_limit": 500,
        "messages": [{"role": "user", "content": chat_parts(big)}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_limit_exceeded"


# -- responses --------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", VISION_MODELS)
def test_responses_with_input_image(client: openai.OpenAI, model: str) -> None:
    r = client.responses.create(model=model, max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG), "detail": "auto"},
                                     {"type": "input_text", "text": "Describe the image."}]}])
    plain = client.responses.create(model=model, max_output_tokens=4, temperature=0, input="Describe the image.")
    assert r.status == "completed" or r.incomplete_details is not None
    assert r.usage.input_tokens > plain.usage.input_tokens


# -- decisions --------------------------------------------------------------------------------------

QUESTIONS = [
    {"type": "predicate", "name": "cat", "instructions": "Does the photo show a cat?"},
    {"type": "choice", "name": "room", "instructions": "Which room is it?",
     "choices": [{"value": "kitchen"}, {"value": "garage"}, {"value": "garden"}]},
    {"type": "score", "name": "light", "instructions": "How bright is it?",
     "levels": [{"label": "dark"}, {"label": "normal"}, {"label": "bright"}]},
]


def decision_input(*urls: str, detail: str | None = None) -> list[dict]:
    parts = [{"type": "input_image", "image_url": u, **({"detail": detail} if detail else {})} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "input_text", "text": "A listing photo."}]}]


@pytest.mark.parametrize("model", VISION_MODELS)
def test_decisions_with_images_through_the_openai_sdk(client: openai.OpenAI, model: str) -> None:
    d = client.decisions.create(model=model, input=decision_input(data_url(PNG), data_url(JPEG, "image/jpeg")),
                                questions=QUESTIONS)
    plain = client.decisions.create(model=model, input="A listing photo.", questions=QUESTIONS)
    assert [a.type for a in d.answers] == ["predicate", "choice", "score"]
    assert d.usage.input_tokens > plain.usage.input_tokens
    again = client.decisions.create(model=model, input=decision_input(data_url(PNG), data_url(JPEG, "image/jpeg")),
                                    questions=QUESTIONS)
    assert again.model_dump()["answers"] == d.model_dump()["answers"]  # repeats exactly


def test_decisions_low_detail_resizes(client: openai.OpenAI) -> None:
    photo = data_url(encoded(noise(1000, 800)))
    default = client.decisions.create(model=QWEN_VL, input=decision_input(photo), questions=QUESTIONS[:1])
    low = client.decisions.create(model=QWEN_VL, input=decision_input(photo, detail="low"), questions=QUESTIONS[:1])
    assert default.usage.input_tokens - low.usage.input_tokens > 400


# -- systemone --------------------------------------------------------------------------------------

def _systemone(server: LiveServer, **body: object) -> httpx.Response:
    return httpx.post(server.v1 + "/systemone", timeout=120, json={
        "model": QWEN_VL, "state": {"listing": "A flat to rent."},
        "questions": {"cat": {"type": "noul", "instructions": "Does the photo show a cat?"}}, **body})


def test_systemone_with_clef_images(vision_server: LiveServer) -> None:
    as_url = _systemone(vision_server, images=[data_url(PNG), data_url(WEBP, "image/webp")])
    as_objects = _systemone(vision_server, images=[
        {"content_type": "image/png", "base64": base64.b64encode(PNG).decode()},
        {"content_type": "image/webp", "base64": base64.b64encode(WEBP).decode()}])
    assert as_url.status_code == 200, as_url.text
    assert as_url.json() == as_objects.json()
    without, empty = _systemone(vision_server), _systemone(vision_server, images=[])
    assert empty.json() == without.json() != as_url.json()  # `"images": []` is no field
    assert as_url.json()["usage"]["input_tokens"] > without.json()["usage"]["input_tokens"]


def test_systemone_with_the_typesafe_sdk(vision_server: LiveServer) -> None:
    with TypeSafeClient(base_url=vision_server.url, api_key="local", model=QWEN_VL, timeout=120,
                        retry=typesafe_sdk.RetryPolicy(max_retries=0)) as ts:
        result = ts.system_one(state={"listing": "A flat to rent."},
                               questions={"cat": Noul(instructions="Does the photo show a cat?")},
                               extra_body={"images": [data_url(PNG), data_url(WEBP, "image/webp")]})
    assert result.raw_http_response.json() == _systemone(
        vision_server, images=[data_url(PNG), data_url(WEBP, "image/webp")]).json()


def test_systemone_multimodal_context_limit(vision_server: LiveServer) -> None:
    state = "The listing describes the flat in detail. " * 520  # ~4,200 tokens: over 4096 with images
    assert _systemone(vision_server, state=state).status_code == 200
    r = _systemone(vision_server, state=state, images=[data_url(PNG)])
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "maximum context length: The decision prompt exceeds the configured context limit."


# -- the image rules, through the routes ------------------------------------------------------------

MiB = 1024 * 1024
NOISE_3MIB = encoded(noise(1024, 1024, seed=7))  # a complete PNG of about 3 MiB


@pytest.mark.parametrize(("images", "message"), [
    ([data_url(PNG[:-20])], "input[0].content[0] is truncated or incomplete."),
    ([data_url(JPEG)], "input[0].content[0] is declared image/png but contains image/jpeg."),
    ([data_url(huge_header_png())], "input[0].content[0] is larger than 16 megapixels."),
    ([data_url(PNG)] * 5, "A request accepts at most 4 images."),
    ([data_url(NOISE_3MIB)] * 3, "images exceed 8 MiB in total."),
    (["https://example.com/cat.png"], "input[0].content[0] must be a base64 data URL; remote URLs are not accepted."),
    (["data:image/gif;base64,R0lGODlh"], "input[0].content[0] data URL must be image/png, image/jpeg, or image/webp."),
    (["data:image/png;base64,***"], "input[0].content[0] is not valid base64."),
])
def test_decision_image_rules(vision_server: LiveServer, images: list[str], message: str) -> None:
    assert len(NOISE_3MIB) > 2.7 * MiB  # three of them pass the 8 MiB total: 3 x 2.7 > 8
    r = httpx.post(vision_server.v1 + "/decisions", timeout=60, json={
        "model": QWEN_VL, "input": decision_input(*images), "questions": QUESTIONS[:1]})
    assert (r.status_code, r.json()["error"]) == (400, {"message": message, "type": "invalid_request_error"})


@pytest.mark.parametrize(("images", "message"), [
    ([data_url(PNG[:-20])], "images[0] is truncated or incomplete."),
    ([{"content_type": "image/png", "base64": base64.b64encode(JPEG).decode()}],
     "images[0] is declared image/png but contains image/jpeg."),
    ([data_url(huge_header_png())], "images[0] is larger than 16 megapixels."),
    ([data_url(PNG)] * 5, "A request accepts at most 4 images."),
    ([data_url(NOISE_3MIB)] * 3, "images exceed 8 MiB in total."),
])
def test_systemone_image_rules(vision_server: LiveServer, images: list, message: str) -> None:
    r = _systemone(vision_server, images=images)
    assert (r.status_code, r.json()["error"]["message"]) == (400, message)


@pytest.mark.parametrize(("url", "message"), [
    (data_url(PNG[:-20]), "messages.0.content.0 is truncated or incomplete."),
    (data_url(JPEG), "messages.0.content.0 is declared image/png but contains image/jpeg."),
    (data_url(huge_header_png()), "messages.0.content.0 is larger than 16 megapixels."),
])
def test_chat_image_rules(vision_server: LiveServer, url: str, message: str) -> None:
    status, error = _chat_error(vision_server, QWEN_VL, chat_parts(url))
    assert (status, error["message"]) == (400, message)
    status, error = _chat_error(vision_server, QWEN_VL, chat_parts(*[data_url(PNG)] * 5))
    assert (status, error["message"]) == (400, "A request accepts at most 4 images.")


# -- swama run -i ------------------------------------------------------------------------------------

def _swama_run(server: LiveServer, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SWAMA_MODELS": os.environ.get("SWAMA_MODELS", "")}
    store = Path(server.log).parent / "vision-store"
    env["SWAMA_MODELS"] = str(next(store.parent.glob("vision-store*")))
    port = server.url.rsplit(":", 1)[1]
    return subprocess.run([sys.executable, "-m", "swama.handlers.cli", "run", *args, "--server-port", port],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("direct", [True, False], ids=["in-process", "via-server"])
def test_swama_run_with_images(vision_server: LiveServer, tmp_path: Path, direct: bool) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    (tmp_path / "b.jpg").write_bytes(JPEG)
    flags = ["--direct"] if direct else []
    done = _swama_run(vision_server, QWEN_VL, "What is this?", "-i", str(tmp_path / "a.png"),
                      "--image-paths", str(tmp_path / "b.jpg"), "-n", "3", "-t", "0", *flags)
    assert done.returncode == 0, done.stderr
    refused = _swama_run(vision_server, TINY_ID, "What is this?", "-i", str(tmp_path / "a.png"), "-n", "2", *flags)
    assert refused.returncode == 1 and NO_VISION in refused.stderr
    (tmp_path / "cut.png").write_bytes(PNG[:-20])
    broken = _swama_run(vision_server, QWEN_VL, "x", "-i", str(tmp_path / "cut.png"), *flags)
    assert broken.returncode != 0 and "is truncated or incomplete" in broken.stderr
