"""POST /v1/audio/transcriptions and POST /v1/audio/speech."""

from __future__ import annotations

from swama.generated.openai_models import CreateSpeechRequest, CreateTranscriptionRequest
from swama.handlers.dispatch import Call, route
from swama.handlers.errors import not_served


@route()
async def create_transcription(call: Call, request: CreateTranscriptionRequest) -> None:
    raise not_served(call.op.method, call.op.path)  # parsed by the generated model, not served yet


@route()
async def create_speech(call: Call, request: CreateSpeechRequest) -> None:
    raise not_served(call.op.method, call.op.path)
