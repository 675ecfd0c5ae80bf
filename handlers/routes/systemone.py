"""POST /v1/systemone: the System One shape over the shared label scorer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Response
from starlette.concurrency import run_in_threadpool

from swama.engine.client import (
    DECISION,
    Cancelled,
    DecisionJob,
    InstalledModel,
    NotFound,
    QuestionView,
    Task,
    check_choice_option_names,
    noul_view,
    render_text,
    systemone_choice_view,
    systemone_score_view,
)
from swama.generated.systemone_models import (
    SystemOneChoiceQuestion,
    SystemOneRequest,
    SystemOneRequestImages1,
    SystemOneScoreQuestion,
)
from swama.handlers.http.pipeline import Call, route
from swama.handlers.http.settings import server_default_model
from swama.handlers.http.streaming import collect_or_cancel
from swama.handlers.media.images import (
    Image,
    ImageRef,
    check_image,
    check_images,
    decode_base64,
    load_data_image,
    open_images,
)
from swama.handlers.routes.decision_rules import (
    MAX_CHOICES,
    adjustment_of,
    checkpoint_refusal,
    decision_defaults,
    plain,
)
from swama.handlers.routes.systemone_render import render_systemone_response
from swama.handlers.routes.systemone_wording import SYSTEMONE_RULES, Question, Questions

# Model names System One clients send by default; they mean "the server's model".
SDK_DEFAULT_MODELS = {"jev-latest"}


def answering_model(call: Call, name: str) -> InstalledModel:
    """The installed model for `name`: itself, or for an SDK default name the server's default model."""
    found = call.engine.find(name)
    if found is not None:
        return found
    if name.strip().lower() in SDK_DEFAULT_MODELS and \
            (default := server_default_model(call.settings, call.engine)) is not None:
        return default
    installed = ", ".join(m.id for m in call.engine.models()) or "none"
    raise NotFound(f"The model '{name}' is not available locally (installed: {installed}).")


@route(SYSTEMONE_RULES)
async def create_system_one(call: Call, request: SystemOneRequest) -> Response:
    body = await answer(call, request, lambda: answering_model(call, request.model))
    return Response(body, media_type="application/json")


async def answer(call: Call, request: SystemOneRequest, model_of: Callable[[], InstalledModel]) -> bytes:
    """The System One answer body for `request`, by the model `model_of` names: the one decision path
    every System One shaped route (this one, Workers AI's Clef) takes, checks in the route's order."""
    questions = questions_of(request)
    check_questions(questions)
    model = model_of()
    if request.images and model.kind != DECISION:  # a model without vision refuses them before any is decoded
        call.engine.require(model, Task.READ_IMAGES)
    images = await run_in_threadpool(images_of, request)  # `"images": []` is the same as no field; off the loop
    views = [question_view(q) for _, q in questions]
    defaults = decision_defaults(call.settings, model)
    adjustments = [adjustment_of(request, q, view, defaults) for (_, q), view in zip(questions, views, strict=True)]
    if model.kind == DECISION:
        if any(a.active for a in adjustments):
            raise checkpoint_refusal(model.id)
        return await _on_checkpoint(call, request, model, questions, await open_images(images))
    call.engine.require(model, Task.DECIDE)
    job = DecisionJob(render_text(request.state), views,
                      context_limit=call.settings.context_limit, systemone=True, images=await open_images(images),
                      adjustments=adjustments)
    async for result in collect_or_cancel(call.request, call.engine.decide(model.id, job)):
        answers = [(qid, q, scored) for (qid, q), scored in zip(questions, result.answers, strict=True)]
        return render_systemone_response(model.id, answers, result.input_tokens, result.applied)
    raise Cancelled()


async def _on_checkpoint(call: Call, request: SystemOneRequest, model: InstalledModel, questions: Questions,
                         images: list[Any]) -> bytes:
    """A decision checkpoint answers through its own head, from the questions as System One states them."""
    specs = {qid: q.model_dump(mode="json", exclude_none=True) for qid, q in questions}
    result = await call.engine.predict_checkpoint(model.id, request.state, specs, images)
    answers = [(qid, q, scored) for (qid, q), scored in zip(questions, result.answers, strict=True)]
    return render_systemone_response(model.id, answers, result.input_tokens)


# The typed request --------------------------------------------------------------------------


def questions_of(request: SystemOneRequest) -> Questions:
    return [(question_id, question.root) for question_id, question in request.questions.items()]


def check_questions(questions: Questions) -> None:
    """The rule no schema can say: option names the prompt can tell apart."""
    for _, question in questions:
        if isinstance(question, SystemOneChoiceQuestion):
            check_choice_option_names(list(question.criteria), MAX_CHOICES)


def question_view(question: Question) -> QuestionView:
    instructions = plain(question.instructions)
    if isinstance(question, SystemOneChoiceQuestion):
        return systemone_choice_view(instructions, list(question.criteria.items()))
    if isinstance(question, SystemOneScoreQuestion):
        return systemone_score_view(instructions, [plain(level) for level in question.criteria])
    criteria = question.criteria
    return noul_view(instructions, criteria and criteria.true, criteria and criteria.false)


def images_of(request: SystemOneRequest) -> list[Image]:
    """Clef's `images`: data-URL strings or `{content_type, base64}` objects, each checked, then
    the request-wide limits. Null and `[]` mean no images."""
    images = []
    for i, item in enumerate(request.images or []):
        where = f"images[{i}]"
        if isinstance(item, SystemOneRequestImages1):
            data = decode_base64(item.base64, where)
            images.append(check_image(data, where, item.content_type.value))
        else:
            images.append(load_data_image(ImageRef(where, item.root)))
    check_images(images)
    return images
