"""POST /v1/decisions: the OpenAI Decisions shape over the shared label scorer."""

from __future__ import annotations

from fastapi import Response

from swama.engine.decisions.decide import DecisionJob
from swama.engine.decisions.scorer import DecisionError
from swama.engine.kinds import DECISION
from swama.generated.decisions_models import DecisionCreateRequest
from swama.handlers.decisions_wire import (
    DECISION_RULES,
    LABEL_MASS_HEADER,
    check_questions,
    input_of,
    label_masses,
    question_view,
    questions_of,
    render_decision_response,
)
from swama.handlers.dispatch import Call, route
from swama.handlers.errors import ApiError
from swama.handlers.images import all_low_detail, load_data_images, open_images
from swama.handlers.streaming import collect_or_cancel


@route(DECISION_RULES)
async def create_decision(call: Call, request: DecisionCreateRequest) -> Response:
    questions = questions_of(request)
    check_questions(questions)
    model = call.engine.installed(request.model)  # 404 before any other work
    text, refs = input_of(request.input)
    images = load_data_images(refs)
    if model.kind == DECISION:
        raise DecisionError(400, f"Model '{model.id}' is a decision checkpoint: it answers System One questions "
                                 "on /v1/systemone, not /v1/decisions.")
    call.engine.require_language_model(model)
    job = DecisionJob(text, [question_view(q) for q in questions], context_limit=call.settings.context_limit,
                      images=open_images(images), low_detail=all_low_detail(images))
    async for result in collect_or_cancel(call.request, call.engine.decide(model.id, job)):
        body = render_decision_response(request.model, list(zip(questions, result.answers, strict=True)),
                                        result.input_tokens)
        # Outside the wire body (which follows the OpenAI shape exactly): each answer's label mass,
        # the labels' probability against the whole vocabulary, for the playground and the curious.
        return Response(body, media_type="application/json", headers={LABEL_MASS_HEADER: label_masses(result.answers)})
    raise ApiError(499, "The client closed the request.", code="cancelled")
