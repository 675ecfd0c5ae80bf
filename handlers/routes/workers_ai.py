"""POST .../ai/run/@cf/cloudflare/clef and clef-flash: Cloudflare Workers AI's Clef routes, a thin
adapter over the System One decision path (same scorer, prompt and checks), answered in
Cloudflare's v4 envelope."""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import Response

from swama.engine.client import BadInput, InstalledModel
from swama.generated.systemone_models import SystemOneRequest
from swama.generated.workers_ai_models import WorkersAiClefFlashRequest, WorkersAiClefRequest
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import Call, RouteRules, route
from swama.handlers.http.settings import server_default_model
from swama.handlers.routes.decision_rules import faults, refuse
from swama.handlers.routes.systemone import answer
from swama.handlers.routes.systemone_wording import SYSTEMONE_RULES

ClefRequest = WorkersAiClefRequest | WorkersAiClefFlashRequest
MAX_QUESTIONS = WorkersAiClefRequest.model_json_schema()["properties"]["questions"]["maxProperties"]


def _schema_error(exc: pydantic.ValidationError, data: Any) -> ApiError:
    """System One's wording, except for what the cards narrow: the model names and the question count."""
    found = faults(exc, data)
    if any(f.path == ("model",) for f in found):
        return refuse("model must be clef or clef-flash.")
    questions = data.get("questions")
    if isinstance(questions, dict) and len(questions) > MAX_QUESTIONS:
        return refuse(f"A request accepts at most {MAX_QUESTIONS} questions.")
    return SYSTEMONE_RULES.schema_error(exc, data)


def refuse_nulls(data: dict[str, Any]) -> None:
    """The generated models take null for every optional field; the cards make none nullable."""
    if "images" in data and data["images"] is None:
        raise refuse("images must be an array.")
    questions = data.get("questions")
    for question in questions.values() if isinstance(questions, dict) else ():
        if isinstance(question, dict) and question.get("type") == "noul" and \
                "criteria" in question and question["criteria"] is None:
            raise refuse("noul criteria must be an object.")


WORKERS_AI_RULES = RouteRules(
    bad_json=SYSTEMONE_RULES.bad_json,
    not_object=SYSTEMONE_RULES.not_object,
    before_model=refuse_nulls,
    schema_error=_schema_error,
    handled=frozenset({"model", "state", "questions", "images", "x_debias", "x_calibration"}),
)


def clef_model(call: Call) -> InstalledModel:
    """The local model both Clef names mean: `--clef-model`, else the server's model."""
    name = call.settings.clef_model
    found = call.engine.find(name) if name else server_default_model(call.settings, call.engine)
    if found is not None:
        return found
    installed = ", ".join(m.id for m in call.engine.models()) or "none"
    wanted = f"the Clef model '{name}'" if name else "a model for Clef (start swama serve with one)"
    # Workers AI's "No such model" (5007) is a 400.
    raise BadInput(f"No such model: {wanted} is not available locally (installed: {installed}).",
                   code="model_not_found")


def as_systemone(request: ClefRequest) -> SystemOneRequest:
    """The same request in System One's model; the cards take no field System One lacks."""
    data = request.model_dump(mode="json", exclude_unset=True, include={"state", "questions", "images", "x_debias", "x_calibration"})
    data["model"] = request.model.strip()
    try:
        return SystemOneRequest.model_validate(data)
    except pydantic.ValidationError as exc:
        raise SYSTEMONE_RULES.schema_error(exc, data) from None


async def _run(call: Call, request: ClefRequest) -> Response:
    body = await answer(call, as_systemone(request), lambda: clef_model(call))
    return Response(b'{"result":' + body + b',"success":true,"errors":[],"messages":[]}',
                    media_type="application/json")


# One handler per card, each taking its own generated model; both answer the same way.
@route(WORKERS_AI_RULES)
async def run_clef(call: Call, request: WorkersAiClefRequest) -> Response:
    return await _run(call, request)


@route(WORKERS_AI_RULES)
async def run_clef_flash(call: Call, request: WorkersAiClefFlashRequest) -> Response:
    return await _run(call, request)
