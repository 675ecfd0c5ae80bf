"""POST /v1/embeddings."""

from __future__ import annotations

from swama.generated.openai_models import CreateEmbeddingRequest
from swama.handlers.dispatch import Call, RouteRules, route
from swama.handlers.errors import not_served


# Not served yet: every field the spec names parses, then the route answers 501.
@route(RouteRules(handled=frozenset(CreateEmbeddingRequest.model_fields)))
async def create_embedding(call: Call, request: CreateEmbeddingRequest) -> None:
    raise not_served(call.op.method, call.op.path)  # parsed by the generated model, not served yet
