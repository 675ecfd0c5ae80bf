"""POST /v1/audio/transcriptions: speech to text on an installed speech-to-text model (Whisper).

The body is multipart/form-data (dispatch refuses anything else). The checks run cheapest first:
the file's size, the model (installed, and a speech-to-text one), the language, then the audio
itself, decoded off the event loop.
"""

from __future__ import annotations

import asyncio

from fastapi import Response

from swama.engine.client import Task
from swama.generated.openai_models import CreateTranscriptionRequest
from swama.handlers.http.body import TOO_LARGE, TRANSCRIPTION_FILE_LIMIT
from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.pipeline import Call, RouteRules, route
from swama.handlers.media.audio_decode import AudioDecodeError, decode_audio
from swama.handlers.routes.transcriptions_render import render

# Any other field the pinned spec names is refused by dispatch, never ignored.
HANDLED = frozenset({"file", "model", "language", "prompt", "response_format", "temperature",
                     "timestamp_granularities"})
PATH = "/v1/audio/transcriptions"


@route(RouteRules(handled=HANDLED))
async def create_transcription(call: Call, request: CreateTranscriptionRequest) -> Response | dict:
    if len(request.file) > TRANSCRIPTION_FILE_LIMIT:
        raise ApiError(413, TOO_LARGE[PATH], code="request_too_large", param="file")
    model = call.engine.model_for(request.model, Task.TRANSCRIBE)
    if any(str(g) != "segment" for g in request.timestamp_granularities):
        raise bad_request("Word timestamps are not supported; segment timestamps come with verbose_json, srt and "
                          "vtt.", code="unsupported_value", param="timestamp_granularities")
    language = call.engine.transcription_language(request.language)
    try:
        audio = await asyncio.to_thread(decode_audio, request.file, max_seconds=call.settings.max_audio_seconds,
                                        max_rate=call.settings.max_audio_sample_rate)
    except AudioDecodeError as exc:
        raise bad_request(exc.message, code="invalid_audio", param="file") from None
    transcript = await call.engine.transcribe(model.id, audio, language=language, prompt=request.prompt or None,
                                              temperature=float(request.temperature))
    return render(transcript, str(request.response_format or "json"))
