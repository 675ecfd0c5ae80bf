"""POST /v1/audio/speech (experimental): text to speech on a local text-to-speech model.

The audio goes out as the model makes it: WAV and PCM segment by segment, FLAC and MP3 once the
whole clip is encoded; `stream_format: "sse"` wraps the same bytes in base64 `speech.audio.delta`
events and ends with `speech.audio.done`.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pydantic
from fastapi import Response
from fastapi.responses import StreamingResponse

from swama.engine.client import NO_SPEECH, EngineError, SpeechSegment, Task
from swama.generated.openai_models import CreateSpeechRequest
from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.pipeline import Call, RouteRules, route
from swama.handlers.http.schema_errors import openai_schema_error, user_path
from swama.handlers.http.streaming import collect_or_cancel
from swama.handlers.media.audio_encode import FORMATS, MEDIA_TYPES, Encoder

log = logging.getLogger("swama")

SPEED_MIN, SPEED_MAX = 0.25, 4.0
INPUT_REQUIRED = "Input text is required"
SPEED_RANGE = f"Speed must be between {SPEED_MIN} and {SPEED_MAX}"


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _first_rules(data: dict[str, Any]) -> None:
    """The two refusals that come before anything else, in this order."""
    if _blank(data.get("input")):
        raise bad_request(INPUT_REQUIRED, param="input")
    speed = data.get("speed")
    if isinstance(speed, int | float) and not isinstance(speed, bool) and not SPEED_MIN <= speed <= SPEED_MAX:
        raise bad_request(SPEED_RANGE, param="speed")


def _unsupported_format(value: Any) -> ApiError:
    return bad_request(f"Unsupported response_format '{value}'", param="response_format")


def schema_error(exc: pydantic.ValidationError, data: Any = None) -> ApiError:
    for error in exc.errors(include_url=False):
        path = user_path(error["loc"], data)
        if path == ["response_format"] and isinstance(data, dict) and isinstance(data.get("response_format"), str):
            return _unsupported_format(data["response_format"])
    return openai_schema_error(exc, data)


# `instructions` is in the OpenAI shape but no local model here takes it: refused, not ignored.
HANDLED = frozenset({"model", "input", "voice", "response_format", "speed", "stream_format"})
RULES = RouteRules(before_model=_first_rules, schema_error=schema_error, handled=HANDLED)


def _voice_name(voice: Any) -> str | None:
    while isinstance(voice, pydantic.RootModel):
        voice = voice.root
    if voice is None:
        return None
    return str(getattr(voice, "id", voice))


@route(RULES)
async def create_speech(call: Call, request: CreateSpeechRequest) -> Response:
    engine = call.engine
    name = request.model
    model = engine.model_for(name, Task.SPEAK)
    fmt = str(request.response_format)
    if fmt not in FORMATS:
        raise _unsupported_format(fmt)
    voice = engine.voices(model.id).pick(_voice_name(request.voice))
    segments = engine.speak(model.id, request.input, voice, float(request.speed))
    # Errors before the first audio (a missing espeak-ng, memory) still get a plain HTTP error.
    try:
        first = await segments.__anext__()
    except StopAsyncIteration:
        raise bad_request(NO_SPEECH, param="input") from None
    encoder = Encoder(fmt, first.sample_rate)
    headers = {"X-Sample-Rate": str(first.sample_rate), "Cache-Control": "no-cache"}
    if str(request.stream_format) == "sse":
        return StreamingResponse(_sse(first, segments, encoder), media_type="text/event-stream", headers=headers)
    if encoder.streams:
        return StreamingResponse(_audio(first, segments, encoder), media_type=MEDIA_TYPES[fmt], headers=headers)
    pieces = [encoder.feed(first.audio)]
    finished = False
    try:
        async for segment in collect_or_cancel(call.request, segments):
            pieces.append(encoder.feed(segment.audio))
        finished = True
    finally:
        await segments.aclose()
    if not finished or await call.request.is_disconnected():
        raise ApiError(408, "The request was cancelled before the audio was ready.", code="cancelled")
    pieces.append(encoder.finish())
    return Response(b"".join(pieces), media_type=MEDIA_TYPES[fmt], headers=headers)


async def _all(first: SpeechSegment, segments: AsyncIterator[SpeechSegment]) -> AsyncIterator[SpeechSegment]:
    """Every segment; a failure after the first byte went out can only end the stream early."""
    yield first
    try:
        async for segment in segments:
            yield segment
    except EngineError as exc:
        log.warning("speech stream ended early: %s", exc.message)
    finally:
        await segments.aclose()


async def _audio(first: SpeechSegment, segments: AsyncIterator[SpeechSegment], encoder: Encoder) -> AsyncIterator[bytes]:
    async for segment in _all(first, segments):
        if piece := encoder.feed(segment.audio):
            yield piece
    if tail := encoder.finish():
        yield tail


async def _sse(first: SpeechSegment, segments: AsyncIterator[SpeechSegment], encoder: Encoder) -> AsyncIterator[bytes]:
    def event(body: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(body)}\n\n".encode()

    def delta(piece: bytes) -> bytes:
        return event({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode("ascii")})

    tokens = 0
    async for segment in _all(first, segments):
        tokens += segment.tokens
        if piece := encoder.feed(segment.audio):
            yield delta(piece)
    if tail := encoder.finish():
        yield delta(tail)
    # The model reads text (phoneme) tokens and writes a waveform, not audio tokens.
    yield event({"type": "speech.audio.done",
                 "usage": {"input_tokens": tokens, "output_tokens": 0, "total_tokens": tokens}})
