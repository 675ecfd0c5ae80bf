"""POST /v1/audio/speech."""

from __future__ import annotations

from swama.generated.openai_models import CreateSpeechRequest
from swama.handlers.dispatch import Call, RouteRules, route
from swama.handlers.errors import not_served


# Not served yet: every field the spec names parses, then the route answers 501.
@route(RouteRules(handled=frozenset(CreateSpeechRequest.model_fields)))
async def create_speech(call: Call, request: CreateSpeechRequest) -> None:
    raise not_served(call.op.method, call.op.path)
