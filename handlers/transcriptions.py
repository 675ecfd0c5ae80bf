"""POST /v1/audio/transcriptions."""

from __future__ import annotations

from swama.generated.openai_models import CreateTranscriptionRequest
from swama.handlers.dispatch import Call, RouteRules, route
from swama.handlers.errors import not_served


# Not served yet: every field the spec names parses, then the route answers 501.
@route(RouteRules(handled=frozenset(CreateTranscriptionRequest.model_fields)))
async def create_transcription(call: Call, request: CreateTranscriptionRequest) -> None:
    raise not_served(call.op.method, call.op.path)  # parsed by the generated model, not served yet
