"""Debiasing and calibration on the three decision routes of a live server (SmolLM2): the defaults are
byte for byte what they were, what was applied comes back in the served schema, a question's own
choice wins over the request's, refusals come in each route's envelope, and concurrent requests
get the answers they would alone."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx
import pytest
from precision import BF16_PROBABILITY, F32_PROBABILITY, tol

from live_server import LiveServer
from swama.generated.decisions_models import Decision
from swama.generated.systemone_models import SystemOneResponse
from swama.generated.workers_ai_models import WorkersAiClefResponse

SMOL = "smollm2"
CLEF = "/client/v4/accounts/local/ai/run/@cf/cloudflare/clef"
# A question scored beside its other orders or other requests' rows against it alone: the same
# probabilities from other batch compositions (another summation order).
BOUND = tol(F32_PROBABILITY, BF16_PROBABILITY)
INPUT = "My order arrived broken and nobody answers my emails."
DECISION_QUESTIONS = [
    {"type": "predicate", "name": "angry", "instructions": "Is the customer upset?"},
    {"type": "choice", "name": "team", "instructions": "Which team should handle this?",
     "choices": [{"value": "billing"}, {"value": "shipping", "description": "deliveries and damage"},
                 {"value": "sales"}, {"value": False}]},
    {"type": "score", "name": "urgency", "instructions": "How urgent is it?",
     "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high"}]},
]
SYSTEMONE_QUESTIONS = {
    "angry": {"type": "noul", "instructions": "Is the customer upset?"},
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": None, "shipping": "deliveries and damage", "sales": None}},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]},
}


def post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=300)


def decisions(server: LiveServer, **extra: Any) -> httpx.Response:
    return post(server, "/v1/decisions", {"model": SMOL, "input": INPUT, "questions": DECISION_QUESTIONS, **extra})


def systemone(server: LiveServer, **extra: Any) -> httpx.Response:
    return post(server, "/v1/systemone", {"model": SMOL, "state": INPUT, "questions": SYSTEMONE_QUESTIONS, **extra})


def clef(server: LiveServer, **extra: Any) -> httpx.Response:
    return post(server, CLEF, {"model": "clef", "state": INPUT, "questions": SYSTEMONE_QUESTIONS, **extra})


def test_the_defaults_are_byte_for_byte_unchanged(model_server: LiveServer) -> None:
    none = {"x_debias": "none", "x_calibration": "none"}
    for route in (decisions, systemone, clef):
        plain = route(model_server)
        assert plain.status_code == 200, plain.text
        assert b"x_adjustment" not in plain.content
        assert route(model_server, **none).content == plain.content
    marked = [{**q, "x_calibration": "none", **({"x_debias": "none"} if q["type"] == "choice" else {})}
              for q in DECISION_QUESTIONS]
    assert post(model_server, "/v1/decisions", {"model": SMOL, "input": INPUT, "questions": marked}).content == \
        decisions(model_server).content


def test_each_route_says_what_was_applied(model_server: LiveServer) -> None:
    plain = decisions(model_server).json()["answers"]
    body = decisions(model_server, x_debias="permute", x_calibration="contextual").json()
    Decision.model_validate(body)  # the served schema states x_adjustment
    angry, team, urgency = body["answers"]
    assert team["x_adjustment"]["debias"] == "permute" and team["x_adjustment"]["orders"] == 4
    assert angry["x_adjustment"]["debias"] == "none" and urgency["x_adjustment"]["debias"] == "none"
    assert all(a["x_adjustment"]["calibration"] == "contextual" and len(a["x_adjustment"]["content_free"]) ==
               len(a["x_adjustment"]["raw_probabilities"]) for a in body["answers"])
    assert [p["probability"] for p in plain[1]["probabilities"]] == \
        pytest.approx(team["x_adjustment"]["raw_probabilities"], abs=BOUND)
    assert angry["x_adjustment"]["raw_probabilities"][0] == pytest.approx(plain[0]["probability"], abs=BOUND)
    assert team["choice"] in {"billing", "shipping", "sales", False}

    one = systemone(model_server, x_debias="permute").json()
    SystemOneResponse.model_validate(one)
    assert one["answers"]["team"]["x_adjustment"]["orders"] == 3
    assert "x_adjustment" in one["answers"]["angry"]  # asked (by the request), nothing to apply
    cloudflare = clef(model_server, x_debias="permute").json()
    WorkersAiClefResponse.model_validate(cloudflare)
    assert cloudflare["result"] == one  # Clef is System One's path, in Cloudflare's envelope


def test_a_questions_own_choice_wins(model_server: LiveServer) -> None:
    questions = [dict(DECISION_QUESTIONS[0], x_calibration="contextual"),
                 dict(DECISION_QUESTIONS[1], x_debias="none"), DECISION_QUESTIONS[2]]
    body = post(model_server, "/v1/decisions",
                {"model": SMOL, "input": INPUT, "questions": questions, "x_debias": "permute"}).json()
    angry, team, urgency = body["answers"]
    assert angry["x_adjustment"]["calibration"] == "contextual"
    assert "x_adjustment" not in team  # its own none wins over the request's permute
    assert urgency["x_adjustment"] == {"debias": "none", "calibration": "none", "orders": 1,
                                       "raw_probabilities": [p["probability"] for p in urgency["probabilities"]]}
    wanted = {"angry": dict(SYSTEMONE_QUESTIONS["angry"], x_calibration="contextual"),
              "team": dict(SYSTEMONE_QUESTIONS["team"], x_debias="prior")}
    one = post(model_server, "/v1/systemone", {"model": SMOL, "state": INPUT, "questions": wanted}).json()
    assert one["answers"]["angry"]["x_adjustment"]["calibration"] == "contextual"
    assert one["answers"]["team"]["x_adjustment"]["prior_source"] in {"estimating", "estimated"}


def test_refusals_come_in_each_routes_envelope(model_server: LiveServer) -> None:
    r = decisions(model_server, x_calibration="fitted")
    assert r.status_code == 400 and "swama calibrate" in r.json()["error"]["message"]
    r = systemone(model_server, x_calibration="fitted")
    assert r.status_code == 400 and "swama calibrate" in r.json()["error"]["message"]
    r = clef(model_server, x_calibration="fitted")
    assert r.status_code == 400 and r.json()["success"] is False
    assert "swama calibrate" in r.json()["errors"][0]["message"]
    for bad in ({"x_debias": "shuffle"}, {"x_calibration": True}):
        for route in (decisions, systemone, clef):
            assert route(model_server, **bad).status_code == 400
    predicate_debias = [dict(DECISION_QUESTIONS[0], x_debias="permute")]  # no option order to correct
    r = post(model_server, "/v1/decisions", {"model": SMOL, "input": INPUT, "questions": predicate_debias})
    assert r.status_code == 400 and "x_debias" in r.json()["error"]["message"]


def test_concurrent_adjusted_requests_get_their_own_answers(model_server: LiveServer) -> None:
    inputs = [f"Ticket {i}: " + text for i, text in enumerate(
        ["The refund never came.", "The box was crushed.", "I want to buy ten more.", "The app crashes."])]

    def ask(text: str) -> list:
        r = post(model_server, "/v1/decisions", {"model": SMOL, "input": text, "questions": DECISION_QUESTIONS,
                                                  "x_debias": "permute", "x_calibration": "contextual"})
        assert r.status_code == 200, r.text
        return [a.get("probabilities", a.get("probability")) for a in r.json()["answers"]]

    alone = [ask(text) for text in inputs]
    with concurrent.futures.ThreadPoolExecutor(len(inputs)) as pool:
        together = list(pool.map(ask, inputs))
    for a, b in zip(alone, together, strict=True):
        assert a[0] == pytest.approx(b[0], abs=BOUND)
        for x, y in zip(a[1:], b[1:], strict=True):
            assert [p["probability"] for p in x] == pytest.approx([p["probability"] for p in y], abs=BOUND)
