"""POST /v1/audio/transcriptions on a live server with Whisper tiny.en installed: the official openai
SDK in every response format, compressed uploads, the refusals and the 100 MB limit
(tests/live/test_transcription_cli.py covers `swama transcribe`)."""

from __future__ import annotations

import io
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from conftest import TINY_ID, WHISPER_ID
from openai import BadRequestError, OpenAI
from test_transcription import SHORT_WER_BOUND, word_error_rate, words

from live_server import LiveServer, start_server
from model_fixtures import SpeechClip
from swama.handlers.http.body import BODY_LIMITS, TRANSCRIPTION_FILE_LIMIT

pytestmark = pytest.mark.slow

ROUTE = "/v1/audio/transcriptions"
CUE = re.compile(r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)")


@pytest.fixture(scope="module")
def server(speech_store: Path) -> Iterator[LiveServer]:
    live = start_server(speech_store, speech_store.parent / "speech-server.log")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.v1, api_key="sk-local", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def speech(speech_clips: dict[str, SpeechClip]) -> SpeechClip:
    return speech_clips["door"]


def _seconds(parts: tuple[str, ...]) -> float:
    h, m, s, ms = (int(p) for p in parts)
    return h * 3600 + m * 60 + s + ms / 1000


def _cue_texts(subtitles: str) -> tuple[list[tuple[float, float]], str]:
    times = [(_seconds(m.groups()[:4]), _seconds(m.groups()[4:])) for m in CUE.finditer(subtitles)]
    lines = [line for line in subtitles.splitlines()
             if line.strip() and not CUE.search(line) and not line.strip().isdigit() and line != "WEBVTT"]
    return times, " ".join(lines)


def test_every_response_format_through_the_openai_sdk(client: OpenAI, speech: SpeechClip) -> None:
    def create(fmt: str, model: str = WHISPER_ID, **kwargs):
        with speech.path.open("rb") as f:
            raw = client.audio.transcriptions.with_raw_response.create(model=model, file=f, response_format=fmt,
                                                                       **kwargs)
        return raw.headers["content-type"].split(";")[0], raw.parse()

    content_type, plain = create("json", "whisper-tiny.en")
    assert content_type == "application/json"
    assert word_error_rate(speech.text, plain.text) <= SHORT_WER_BOUND, plain.text

    content_type, text = create("text")
    assert content_type == "text/plain"
    assert isinstance(text, str) and text.strip() == plain.text

    content_type, verbose = create("verbose_json", "whisper-tiny-en", language="en", temperature=0)
    assert content_type == "application/json"
    assert verbose.text == plain.text and verbose.language == "english"
    duration = sf.info(str(speech.path)).duration
    # The 22,050 Hz clip resampled to 16 kHz (under a sample, 6e-5 s, off), rounded to milliseconds.
    assert verbose.duration == pytest.approx(duration, abs=1e-3)
    assert verbose.segments and verbose.segments[0].start == 0
    for segment in verbose.segments:
        assert 0 <= segment.start < segment.end <= duration + 0.5 and segment.tokens
        assert segment.avg_logprob <= 0 and 0 <= segment.no_speech_prob <= 1 and segment.compression_ratio > 0
        assert segment.model_extra == {}  # every field is one the SDK knows

    for fmt, header, media_type in (("srt", "1\n", "application/x-subrip"), ("vtt", "WEBVTT\n\n", "text/vtt")):
        content_type, subtitles = create(fmt)
        assert content_type == media_type
        assert isinstance(subtitles, str) and subtitles.startswith(header)
        times, spoken = _cue_texts(subtitles)
        assert times == [(s.start, s.end) for s in verbose.segments]
        assert words(spoken) == words(plain.text)


def test_verbose_json_fields(server: LiveServer, speech_clips: dict[str, SpeechClip]) -> None:
    clip = speech_clips["call"]
    body = httpx.post(server.v1 + "/audio/transcriptions", files={"file": ("call.wav", clip.path.read_bytes())},
                      data={"model": WHISPER_ID, "response_format": "verbose_json"}, timeout=120).json()
    assert set(body) == {"task", "language", "duration", "text", "segments"} and body["task"] == "transcribe"
    assert set(body["segments"][0]) == {"id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
                                        "compression_ratio", "no_speech_prob"}


@pytest.mark.parametrize("fmt", ["MP3", "FLAC", "OGG"])
def test_compressed_uploads(client: OpenAI, speech: SpeechClip, fmt: str) -> None:
    mono, rate = sf.read(str(speech.path), dtype="float32")
    encoded = io.BytesIO()
    sf.write(encoded, mono, rate, format=fmt)
    result = client.audio.transcriptions.create(model=WHISPER_ID, file=(f"clip.{fmt.lower()}", encoded.getvalue()))
    assert word_error_rate(speech.text, result.text) <= SHORT_WER_BOUND, result.text


# -- refusals -------------------------------------------------------------------------------------


def _refused(server: LiveServer, status: int = 400, **kwargs) -> dict:
    r = httpx.post(server.v1 + "/audio/transcriptions", timeout=60, **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_bad_uploads(server: LiveServer, speech: SpeechClip) -> None:
    wav = speech.path.read_bytes()
    model = {"model": WHISPER_ID}
    cases = [
        (b"PK\x03\x04 this is a zip, not a sound" * 10, "is not audio swama can read"),
        (wav[: len(wav) // 3], "The WAV file is truncated"),
        (b"", "The audio file is empty."),
        (b"\0\0\0\x20ftypM4A " + bytes(500), "M4A/AAC (MP4 audio) needs ffmpeg"),
    ]
    for data, message in cases:
        error = _refused(server, files={"file": ("upload.wav", data)}, data=model)
        assert message in error["message"] and error["param"] == "file"
    error = _refused(server, files={"file": ("speech.wav", wav)}, data={"model": TINY_ID})
    assert error["message"] == f"Model '{TINY_ID}' is not a supported audio model"
    error = _refused(server, 404, files={"file": ("speech.wav", wav)}, data={"model": "whisper-large-v3"})
    assert error["message"] == "The model is not available locally."
    error = _refused(server, data=model, files={"other": ("x", b"1")})
    assert "file" in error["message"]
    error = _refused(server, 415, json={"model": WHISPER_ID, "file": "abc"})
    assert error["code"] == "unsupported_media_type" and "reads only multipart/form-data bodies" in error["message"]
    error = _refused(server, files={"file": ("speech.wav", wav)}, data={**model, "language": "xx"})
    assert error["message"].startswith("Unsupported language 'xx'")
    error = _refused(server, files={"file": ("speech.wav", wav)}, data={**model, "language": "de"})
    assert "transcribes English only" in error["message"]
    error = _refused(server, files={"file": ("speech.wav", wav)}, data={**model, "timestamp_granularities[]": "word"})
    assert error["message"].startswith("Word timestamps are not supported")
    error = _refused(server, files={"file": ("speech.wav", wav)}, data={**model, "include[]": "logprobs"})
    assert error["code"] == "unsupported_parameter" and error["param"] == "include"
    for field, value in (("temperature", "1.5"), ("response_format", "diarized_json")):
        error = _refused(server, files={"file": ("speech.wav", wav)}, data={**model, field: value})
        assert field in error["message"] or error["param"] == field


def test_openai_sdk_sees_a_bad_request(client: OpenAI) -> None:
    with pytest.raises(BadRequestError, match="is not audio swama can read"):
        client.audio.transcriptions.create(model=WHISPER_ID, file=("a.wav", b"hello, not audio" * 8))


# -- the 100 MB limit -----------------------------------------------------------------------------

BOUNDARY = "swamatestboundary"
CHUNK = bytes(1024 * 1024)


def _multipart(file_size: int) -> tuple[bytes, bytes, int]:
    head = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{WHISPER_ID}\r\n"
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.wav\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{BOUNDARY}--\r\n".encode()
    return head, tail, len(head) + file_size + len(tail)


def _file_chunks(size: int) -> Iterator[bytes]:
    """`size` bytes of zeros, one reused megabyte at a time."""
    while size > 0:
        yield CHUNK[:size] if size < len(CHUNK) else CHUNK
        size -= len(CHUNK)


def _body(file_size: int) -> Iterator[bytes]:
    head, tail, _ = _multipart(file_size)
    yield head
    yield from _file_chunks(file_size)
    yield tail


def _raw_upload(server: LiveServer, file_size: int, *, chunked: bool) -> tuple[int, bytes]:
    """Send the upload over a socket until the server answers; (bytes of body sent, response)."""
    host, port = server.url.removeprefix("http://").split(":")
    total = _multipart(file_size)[2]
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST {ROUTE} HTTP/1.1\r\nHost: {host}\r\nContent-Type: multipart/form-data; "
                     f"boundary={BOUNDARY}\r\n{framing}\r\nConnection: close\r\n\r\n".encode())
        sock.setblocking(False)
        response = b""
        refused = False  # the server closed its end: its answer waits in the socket
        for part in _body(file_size):
            data = f"{len(part):x}\r\n".encode() + part + b"\r\n" if chunked else part
            view = memoryview(data)
            while view:
                try:
                    response += sock.recv(65536)
                except BlockingIOError:
                    pass
                if response:
                    break
                try:
                    n = sock.send(view)
                    view, sent = view[n:], sent + n
                except BlockingIOError:
                    time.sleep(0.001)
                except (BrokenPipeError, ConnectionResetError):
                    # It answered and closed between our last read and this write (a busy machine
                    # makes that window wide): the reset is what our unread bytes caused, and the
                    # answer it sent first is still queued for reading.
                    refused = True
                    break
            if response or refused:
                break
        sock.setblocking(True)
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            more = sock.recv(65536)
            if not more:
                break
            response += more
    return sent, response


def _status_and_json(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body.decode())


def test_declared_oversized_upload_is_refused_unread(server: LiveServer) -> None:
    size = 101 * 1000 * 1000  # a 101 MB file
    sent, response = _raw_upload(server, size, chunked=False)
    status, body = _status_and_json(response)
    assert status == 413 and body["error"]["message"] == "File size exceeds 100MB limit"
    assert sent < 20 * 1024 * 1024  # answered from the headers: the body was never read


def test_chunked_oversized_upload_stops_at_the_limit(server: LiveServer) -> None:
    sent, response = _raw_upload(server, 101 * 1000 * 1000, chunked=True)
    status, body = _status_and_json(response)
    assert status == 413 and body["error"]["message"] == "File size exceeds 100MB limit"
    limit = BODY_LIMITS[ROUTE]
    assert sent < limit + 20 * 1024 * 1024  # the rest of the 101 MB was never taken


@pytest.mark.parametrize("file_size, status", [(TRANSCRIPTION_FILE_LIMIT, 400), (TRANSCRIPTION_FILE_LIMIT + 1, 413)])
def test_the_limit_is_100_million_file_bytes(server: LiveServer, file_size: int, status: int) -> None:
    """100,000,000 bytes of file reach the decoder (zeros are no audio); one byte more is too large."""
    _, _, total = _multipart(file_size)
    assert total <= BODY_LIMITS[ROUTE]  # under the body limit: the file part itself is measured
    r = httpx.post(server.v1 + "/audio/transcriptions", content=_body(file_size), timeout=120,
                   headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}",
                            "content-length": str(total)})
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert message == "File size exceeds 100MB limit" if status == 413 else "is not audio swama can read" in message


def test_silence_gives_an_empty_transcript(client: OpenAI) -> None:
    silence = io.BytesIO()
    sf.write(silence, np.zeros(16000 * 2, dtype=np.float32), 16000, format="WAV")
    result = client.audio.transcriptions.create(model=WHISPER_ID, file=("silence.wav", silence.getvalue()),
                                                response_format="verbose_json")
    assert result.duration == 2.0 and len(result.text) < 40  # 32,000 samples at 16 kHz, exactly
