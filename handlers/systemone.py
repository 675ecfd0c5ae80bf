"""POST /v1/systemone: the System One shape over the shared label scorer."""

from __future__ import annotations

from typing import Any

from fastapi import Response

from swama.engine.decide import DecisionJob
from swama.engine.errors import EngineError
from swama.engine.scorer import IMAGES_NEED_VISION, DecisionError
from swama.handlers.dispatch import Call
from swama.handlers.errors import ApiError
from swama.handlers.streaming import collect_or_cancel
from swama.handlers.systemone_codec import (
    parse_systemone_request,
    render_systemone_response,
    systemone_question_view,
)

# Model names System One clients send by default; they mean "the server's model".
SDK_DEFAULT_MODELS = {"jev-latest"}


def answering_model(call: Call, name: str) -> str:
    """An installed model id for `name`: itself, or for an SDK default name the server's default model."""
    store = call.engine.store
    found = store.find(name)
    if found is not None:
        return found.id
    if name.strip().lower() in SDK_DEFAULT_MODELS:
        for candidate in (call.settings.default_model, "smollm2"):
            if candidate and (default := store.find(candidate)) is not None:
                return default.id
    installed = ", ".join(m.id for m in store.list()) or "none"
    raise EngineError(404, f"The model '{name}' is not available locally (installed: {installed}).",
                      "model_not_found")


# INTERIM: still parses call.body by hand; the generated model is ignored until this route moves over.
async def create_system_one(call: Call, parsed: Any = None) -> Response:
    request = parse_systemone_request(call.body)
    model = answering_model(call, request.model)
    if request.images:
        raise DecisionError(400, IMAGES_NEED_VISION)
    job = DecisionJob(request.state_text, [systemone_question_view(q) for q in request.questions],
                      context_limit=call.settings.context_limit, systemone=True)
    async for result in collect_or_cancel(call.request, call.engine.decide(model, job)):
        body = render_systemone_response(model, list(zip(request.questions, result.answers, strict=True)),
                                         result.input_tokens)
        return Response(body, media_type="application/json")
    raise ApiError(499, "The client closed the request.", code="cancelled")
