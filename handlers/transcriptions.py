"""POST /v1/audio/transcriptions: speech to text on an installed speech-to-text model (Whisper).

The body is multipart/form-data (dispatch refuses anything else). The checks run cheapest first:
the file's size, the model (installed, and a speech-to-text one), the language, then the audio
itself, decoded off the event loop.
"""

from __future__ import annotations

import asyncio

from fastapi import Response

from swama.engine.kinds.transcription import Segment, Transcript, language_code
from swama.generated.openai_models import CreateTranscriptionRequest
from swama.handlers.dispatch import TOO_LARGE, TRANSCRIPTION_FILE_LIMIT, Call, RouteRules, route
from swama.handlers.errors import ApiError, bad_request
from swama.handlers.media.audio_decode import AudioDecodeError, decode_audio

# Any other field the pinned spec names is refused by dispatch, never ignored.
HANDLED = frozenset({"file", "model", "language", "prompt", "response_format", "temperature",
                     "timestamp_granularities"})
PATH = "/v1/audio/transcriptions"
CONTENT_TYPES = {"text": "text/plain; charset=utf-8", "srt": "application/x-subrip; charset=utf-8",
                 "vtt": "text/vtt; charset=utf-8"}


def _timestamp(seconds: float, separator: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _cues(segments: list[Segment], separator: str) -> list[str]:
    return [f"{_timestamp(s.start, separator)} --> {_timestamp(s.end, separator)}\n{s.text.strip()}\n"
            for s in segments]


def to_srt(transcript: Transcript) -> str:
    """SubRip: numbered cues, comma before the milliseconds."""
    return "\n".join(f"{i}\n{cue}" for i, cue in enumerate(_cues(transcript.segments, ","), start=1))


def to_vtt(transcript: Transcript) -> str:
    """WebVTT: a header, then cues with a dot before the milliseconds."""
    return "\n".join(["WEBVTT\n", *_cues(transcript.segments, ".")])


def render(transcript: Transcript, response_format: str) -> Response | dict:
    if response_format == "verbose_json":
        return {"task": "transcribe", **transcript.to_dict()}
    if response_format == "text":
        return Response(transcript.text + "\n", media_type=CONTENT_TYPES["text"])
    if response_format == "srt":
        return Response(to_srt(transcript), media_type=CONTENT_TYPES["srt"])
    if response_format == "vtt":
        return Response(to_vtt(transcript), media_type=CONTENT_TYPES["vtt"])
    return {"text": transcript.text}


def parse_language(name: str | None) -> str | None:
    if name is None:
        return None
    code = language_code(name)
    if code is None:
        raise bad_request(f"Unsupported language '{name}'; give an ISO-639-1 code such as 'en' or 'de'.",
                          code="unsupported_language", param="language")
    return code


@route(RouteRules(handled=HANDLED))
async def create_transcription(call: Call, request: CreateTranscriptionRequest) -> Response | dict:
    if len(request.file) > TRANSCRIPTION_FILE_LIMIT:
        raise ApiError(413, TOO_LARGE[PATH], code="request_too_large", param="file")
    model_id = call.engine.resolve_speech_model(request.model)
    if any(str(g) != "segment" for g in request.timestamp_granularities):
        raise bad_request("Word timestamps are not supported; segment timestamps come with verbose_json, srt and "
                          "vtt.", code="unsupported_value", param="timestamp_granularities")
    language = parse_language(request.language)
    try:
        audio = await asyncio.to_thread(decode_audio, request.file)
    except AudioDecodeError as exc:
        raise bad_request(exc.message, code="invalid_audio", param="file") from None
    transcript = await call.engine.transcribe(model_id, audio, language=language, prompt=request.prompt or None,
                                              temperature=float(request.temperature))
    return render(transcript, str(request.response_format or "json"))
