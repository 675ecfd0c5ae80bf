"""POST /v1/decisions: the OpenAI Decisions shape over the shared label scorer."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import Response

from swama.engine.client import (
    DECISION,
    Cancelled,
    DecisionJob,
    QuestionView,
    Task,
    WrongModel,
    check_choice_option_names,
    decision_choice_view,
    decision_score_view,
    predicate_view,
)
from swama.generated.decisions_models import (
    DecisionChoiceQuestion,
    DecisionCreateRequest,
    DecisionInputMessage,
    DecisionInputText,
    DecisionScoreQuestion,
)
from swama.handlers.http.pipeline import Call, route
from swama.handlers.http.streaming import collect_or_cancel
from swama.handlers.media.images import ImageRef, all_low_detail, load_data_images, open_images
from swama.handlers.routes.decision_rules import MAX_CHOICES, adjustment_of, decision_defaults, refuse
from swama.handlers.routes.decisions_render import LABEL_MASS_HEADER, label_masses, render_decision_response
from swama.handlers.routes.decisions_wording import DECISION_RULES, Question, question_problem


@route(DECISION_RULES)
async def create_decision(call: Call, request: DecisionCreateRequest) -> Response:
    questions = questions_of(request)
    check_questions(questions)
    model = call.engine.model(request.model)  # 404 before any other work
    text, refs = input_of(request.input)
    if model.kind == DECISION:
        raise WrongModel(f"Model '{model.id}' is a decision checkpoint: it answers System One questions on "
                         "/v1/systemone, not /v1/decisions.")
    call.engine.require(model, Task.DECIDE)
    if refs:  # a model without vision refuses images before any is decoded
        call.engine.require(model, Task.READ_IMAGES)
    images = await load_data_images(refs)
    views = [question_view(q) for q in questions]
    defaults = decision_defaults(call.settings, model)
    job = DecisionJob(text, views, context_limit=call.settings.context_limit,
                      images=await open_images(images), low_detail=all_low_detail(images),
                      adjustments=[adjustment_of(request, q, view, defaults)
                                   for q, view in zip(questions, views, strict=True)])
    async for result in collect_or_cancel(call.request, call.engine.decide(model.id, job)):
        body = render_decision_response(request.model, list(zip(questions, result.answers, strict=True)),
                                        result.input_tokens, result.applied)
        # Outside the wire body (which follows the OpenAI shape exactly): each answer's label mass,
        # the labels' probability against the whole vocabulary, for the playground and the curious.
        return Response(body, media_type="application/json", headers={LABEL_MASS_HEADER: label_masses(result.answers)})
    raise Cancelled()


# The typed request ------------------------------------------------------------------------


def questions_of(request: DecisionCreateRequest) -> list[Question]:
    return [q.root for q in request.questions]


def check_questions(questions: Sequence[Question]) -> None:
    """The rules no schema can say, after the model: names, choice values, option names."""
    problem = question_problem(questions)
    if problem:
        raise refuse(problem)
    for question in questions:
        if isinstance(question, DecisionChoiceQuestion):
            check_choice_option_names(question_view(question).option_names, MAX_CHOICES)


def input_of(value: str | list[DecisionInputMessage]) -> tuple[str, list[ImageRef]]:
    """Every input text joined with newlines, and the image parts in order."""
    if isinstance(value, str):
        return value, []
    texts: list[str] = []
    images: list[ImageRef] = []
    for i, message in enumerate(value):
        if isinstance(message.content, str):
            texts.append(message.content)
            continue
        for j, part in enumerate(message.content):
            if isinstance(part.root, DecisionInputText):
                texts.append(part.root.text)
            else:
                detail = part.root.detail.value if part.root.detail is not None else None
                images.append(ImageRef(f"input[{i}].content[{j}]", part.root.image_url, detail))
    return "\n".join(texts), images


def question_view(question: Question) -> QuestionView:
    if isinstance(question, DecisionChoiceQuestion):
        return decision_choice_view(question.instructions,
                                    [(c.value.root, c.description) for c in question.choices])
    if isinstance(question, DecisionScoreQuestion):
        return decision_score_view(question.instructions, [(lv.label, lv.description) for lv in question.levels])
    return predicate_view(question.instructions)
