"""POST /v1/embeddings: strings in, unit-length vectors out, as floats or base64 float32."""

from __future__ import annotations

import base64
from typing import Any

from swama.engine.client import Task
from swama.generated.openai_models import CreateEmbeddingRequest
from swama.handlers.http.errors import bad_request
from swama.handlers.http.pipeline import Call, RouteRules, route

NO_INPUT = "No valid input provided"
EMPTY_INPUT = "Embedding inputs must be non-empty."


def _reference_rules(data: dict[str, Any]) -> None:
    # The reference words an empty input its own way, ahead of the schema's minItems.
    if data.get("input") in ("", []) or (isinstance(data.get("input"), list) and "" in data["input"]):
        raise bad_request(EMPTY_INPUT, param="input")


# `user` identifies an end user to a hosted service; locally it has no effect and is accepted.
RULES = RouteRules(before_model=_reference_rules,
                   handled=frozenset({"input", "model", "encoding_format", "dimensions", "user"}))


def texts_of(request: CreateEmbeddingRequest) -> list[str]:
    """The input as a list of strings; token arrays are refused (the model's own tokenizer reads text)."""
    value = request.input
    if isinstance(value, str):
        return [value]
    items = getattr(value, "root", value)
    if not all(isinstance(item, str) for item in items):
        raise bad_request(NO_INPUT, param="input")
    return list(items)


@route(RULES)
async def create_embedding(call: Call, request: CreateEmbeddingRequest) -> dict[str, Any]:
    texts = texts_of(request)
    model = call.engine.model_for(str(request.model), Task.EMBED)
    result = await call.engine.embed(model.id, texts, request.dimensions)
    as_base64 = str(request.encoding_format) == "base64"
    data = []
    for index, vector in enumerate(result.vectors):
        # base64: the vector's float32 bytes, little-endian, as the OpenAI API sends them.
        value: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode() if as_base64 else vector.tolist()
        data.append({"object": "embedding", "embedding": value, "index": index})
    return {"object": "list", "data": data, "model": str(request.model),
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}}
