"""`swama transcribe` against a live server (every -f format) and in process, with Whisper tiny.en."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY_ID
from test_transcription import SHORT_WER_BOUND, word_error_rate
from test_transcription_live import _cue_texts

from live_server import LiveServer, start_server
from model_fixtures import SpeechClip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(speech_store: Path) -> Iterator[LiveServer]:
    live = start_server(speech_store, speech_store.parent / "speech-cli-server.log")
    yield live
    live.stop()


def _swama(*args: str, store: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "SWAMA_MODELS": str(store), **(env or {})}
    return subprocess.run([sys.executable, "-m", "swama.handlers.cli", "transcribe", *args], env=full,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("fmt", ["text", "json", "verbose", "srt", "vtt"])
def test_cli_formats_through_the_server(server: LiveServer, speech_store: Path, speech_clips: dict[str, SpeechClip],
                                        fmt: str) -> None:
    speech = speech_clips["call"]
    port = server.url.rsplit(":", 1)[1]
    done = _swama(str(speech.path), "-f", fmt, "--server-port", port, store=speech_store)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    if fmt == "text":
        text = out.strip()
    elif fmt in ("json", "verbose"):
        body = json.loads(out)
        text = body["text"]
        assert (set(body) == {"text"}) if fmt == "json" else {"task", "language", "duration", "segments"} <= set(body)
    else:
        assert out.startswith("WEBVTT\n\n" if fmt == "vtt" else "1\n")
        times, text = _cue_texts(out)
        assert times and all(start < end for start, end in times)
    assert word_error_rate(speech.text, text) <= SHORT_WER_BOUND, out


def test_cli_in_process(speech_store: Path, speech_clips: dict[str, SpeechClip]) -> None:
    clip = speech_clips["call"]
    done = _swama(str(clip.path), "--direct", "-m", "whisper-tiny-en", "-f", "json", "--language", "en", store=speech_store)
    assert done.returncode == 0, done.stderr
    assert word_error_rate(clip.text, json.loads(done.stdout)["text"]) <= SHORT_WER_BOUND, done.stdout


def test_cli_errors(speech_store: Path, tmp_path: Path, speech_clips: dict[str, SpeechClip]) -> None:
    speech = speech_clips["call"]
    empty = tmp_path / "empty-store"
    empty.mkdir()
    done = _swama(str(speech.path), "--direct", store=empty)
    assert done.returncode == 1 and "swama pull whisper-tiny.en" in done.stderr
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not audio\n" * 50)
    done = _swama(str(text_file), "--direct", store=speech_store)
    assert done.returncode == 1 and "is not audio swama can read" in done.stderr
    done = _swama(str(speech.path), "--direct", "-m", TINY_ID, store=speech_store)
    assert done.returncode == 1 and f"Model '{TINY_ID}' is not a supported audio model" in done.stderr
    done = _swama(str(tmp_path / "missing.wav"), "--direct", store=speech_store)
    assert done.returncode == 1 and "cannot read" in done.stderr


