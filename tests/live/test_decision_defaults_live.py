"""Server-side defaults for debiasing and calibration (engine/decisions/adjust/defaults.py): a
server started with --decision-calibration contextual, over two copies of the tiny model, one of
whose calibration file names its own defaults (x_debias permute). Clients that send no extension
fields, the TypeSafe SDK among them, get the adjusted answers; a request's own value wins; every
adjusted answer says what was applied; /v1/models says each model's defaults."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import typesafe_sdk
from conftest import install_folder
from typesafe_sdk import Choice, Noul, TypeSafeClient

from live_server import LiveServer, start_server

pytestmark = pytest.mark.slow

SERVED = "test/tiny-served-defaults"  # the server's defaults apply
OWN = "test/tiny-own-defaults"  # its calibration file names its own
BROKEN = "test/tiny-broken-calibration"  # its calibration file cannot be read
STATE = "My order arrived broken and nobody answers my emails."
QUESTIONS = {"team": {"type": "choice", "instructions": "Which team should handle this?",
                      "criteria": {"billing": None, "shipping": "deliveries", "sales": None}},
             "angry": {"type": "noul", "instructions": "Is the customer upset?"}}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("defaults-store")
    install_folder(root, SERVED, tiny_model_dir)
    own = install_folder(root, OWN, tiny_model_dir)
    (own / "swama-calibration.json").write_text(json.dumps(
        {"format": 1, "prompt_format": 1, "temperatures": {}, "priors": {}, "report": {},
         "defaults": {"debias": "permute", "calibration": "none"}}))
    broken = install_folder(root, BROKEN, tiny_model_dir)
    (broken / "swama-calibration.json").write_text('{"format": 1, "defaults": {"debias": "sideways"}}')
    server = start_server(root, root.parent / "defaults-server.log", "--decision-calibration", "contextual")
    yield server
    server.stop()


def systemone(server: LiveServer, model: str, **extra: object) -> dict:
    r = httpx.post(server.v1 + "/systemone", json={"model": model, "state": STATE, "questions": QUESTIONS, **extra},
                   timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["answers"]


def test_the_catalog_says_each_models_defaults(server: LiveServer) -> None:
    catalog = {m["name"]: m for m in httpx.get(server.v1 + "/models", timeout=60).json()["models"]}
    assert catalog[SERVED]["x_decision_defaults"] == {"debias": "none", "calibration": "contextual", "source": "server"}
    assert catalog[OWN]["x_decision_defaults"] == {"debias": "permute", "calibration": "none", "source": "model"}


def test_the_typesafe_sdk_gets_the_servers_calibration_with_no_code_change(server: LiveServer) -> None:
    with TypeSafeClient(base_url=server.url, api_key="local", model=SERVED, timeout=300,
                        retry=typesafe_sdk.RetryPolicy(max_retries=0)) as ts:
        result = ts.system_one(state=STATE, questions={
            "team": Choice(instructions="Which team should handle this?",
                           criteria={"billing": None, "shipping": "deliveries", "sales": None}),
            "angry": Noul(instructions="Is the customer upset?")})
        sdk = result.raw_http_response.json()["answers"]
    asked = systemone(server, SERVED, x_calibration="contextual")  # what a client that can ask gets
    plain = systemone(server, SERVED, x_calibration="none")  # a request's own value wins
    for name in QUESTIONS:
        assert sdk[name]["x_adjustment"]["calibration"] == "contextual"
        assert sdk[name] == asked[name]
        assert "x_adjustment" not in plain[name]


def test_a_models_own_defaults_debias_its_choice_questions_only(server: LiveServer) -> None:
    answers = systemone(server, OWN)
    assert answers["team"]["x_adjustment"]["debias"] == "permute"
    assert answers["team"]["x_adjustment"]["orders"] == 3
    assert "x_adjustment" not in answers["angry"]  # yes/no questions have no option order to correct
    assert answers["team"] == systemone(server, OWN, x_debias="permute", x_calibration="none")["team"]
    decided = httpx.post(server.v1 + "/decisions", timeout=300, json={
        "model": OWN, "input": STATE, "questions": [
            {"type": "choice", "name": "team", "instructions": "Which team?",
             "choices": [{"value": "billing"}, {"value": "shipping"}]}]}).json()
    assert decided["answers"][0]["x_adjustment"]["debias"] == "permute"


def test_a_damaged_calibration_file_leaves_the_servers_defaults_working(server: LiveServer) -> None:
    catalog = {m["name"]: m for m in httpx.get(server.v1 + "/models", timeout=60).json()["models"]}
    assert catalog[BROKEN]["x_decision_defaults"] == {"debias": "none", "calibration": "contextual",
                                                      "source": "server"}
    answers = systemone(server, BROKEN)
    assert all(a["x_adjustment"]["calibration"] == "contextual" for a in answers.values())
    fitted = httpx.post(server.v1 + "/systemone", timeout=300, json={
        "model": BROKEN, "state": STATE, "questions": QUESTIONS, "x_calibration": "fitted"})
    assert fitted.status_code == 400 and "swama calibrate" in fitted.text
