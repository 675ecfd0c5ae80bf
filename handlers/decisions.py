"""POST /v1/decisions: the OpenAI Decisions shape over the shared label scorer."""

from __future__ import annotations

from typing import Any

from fastapi import Response

from swama.engine.decide import DecisionJob
from swama.engine.scorer import IMAGES_NEED_VISION, DecisionError
from swama.handlers.decisions_codec import (
    decision_question_view,
    parse_decision_request,
    render_decision_response,
)
from swama.handlers.dispatch import Call
from swama.handlers.errors import ApiError
from swama.handlers.streaming import collect_or_cancel


# INTERIM: still parses call.body by hand; the generated model is ignored until this route moves over.
async def create_decision(call: Call, parsed: Any = None) -> Response:
    request = parse_decision_request(call.body)
    model_id = call.engine.resolve(request.model)  # 404 before any other work
    if request.images:
        raise DecisionError(400, IMAGES_NEED_VISION)
    job = DecisionJob(request.input_text, [decision_question_view(q) for q in request.questions],
                      context_limit=call.settings.context_limit)
    async for result in collect_or_cancel(call.request, call.engine.decide(model_id, job)):
        body = render_decision_response(request.model, list(zip(request.questions, result.answers, strict=True)),
                                        result.input_tokens)
        return Response(body, media_type="application/json")
    raise ApiError(499, "The client closed the request.", code="cancelled")
