"""schemathesis against our merged OpenAPI document, calling the live server as a contract-testing
client would: every operation, every built-in check, 60 examples each. Beyond "no 5xx", that covers
responses conforming to the spec, schema-invalid data refused and schema-valid data accepted
(ST202): the served document promises no more than the server takes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from conftest import install_folder, stated_handler_rule
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from live_server import LiveServer, start_server
from swama.handlers.http.openapi import merged_spec

pytestmark = pytest.mark.slow

TINY = "test/tiny-qwen3"
# The Clef routes' model field names a card, not a model; the server's Clef model (SmolLM2) answers.
CLEF_SELECTOR = re.compile(r"\s*(clef|clef-flash)\s*")
EXAMPLES = 60  # per operation; derandomized, so CI runs the same cases every time

schema = schemathesis.openapi.from_dict(merged_spec())


def error_message(response) -> str:
    """The refusal's message in any envelope: {"error": {"message"}}, Cloudflare's {"errors": [...]} or
    Cohere's {"message"}."""
    body = response.json()
    if "errors" in body:
        return body["errors"][0]["message"]
    return body["error"]["message"] if "error" in body else body["message"]


def schema_valid_data_accepted(ctx, response, case):
    """ST202, except for a 400 from a rule the overlay states because no schema can say it."""
    if response.status_code == 400:
        if stated_handler_rule(case.operation.definition.raw["operationId"], error_message(response)):
            return None
    return positive_data_acceptance(ctx, response, case)


def _validate(case: Any, server: LiveServer, timeout: float) -> None:
    case.call_and_validate(base_url=server.url, timeout=timeout,
                           excluded_checks=[positive_data_acceptance],
                           additional_checks=[schema_valid_data_accepted])


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, derandomize=True)
def test_api(case, empty_server: LiveServer) -> None:
    """Every operation on a server with no models: valid requests end at the model lookup (404)."""
    _validate(case, empty_server, 30)


# One Clef operation stands for the four: they share the handler, and the two cards' schemas are equal.
model_routes = schema.include(path_regex=r"^(/v1/(decisions|systemone|chat/completions|responses|messages"
                                         r"|messages/count_tokens|rerank|score)|/v2/rerank"
                                         r"|/client/v4/accounts/\{account_id\}/ai/run/@cf/cloudflare/clef)$")


def _on_the_tiny_model(body: Any, path: str) -> None:
    """Point a generated body at the installed tiny model, and keep generations short: the contract
    is about what is accepted, not about how long a random-weight model may talk."""
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str) and not CLEF_SELECTOR.fullmatch(body["model"]):
        body["model"] = TINY
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(key), int | float) and not isinstance(body.get(key), bool):
            body[key] = min(body[key], 4)  # an integral float stays a number the schema takes
        elif key in body and body[key] is None:
            body[key] = 4  # null means "no limit": a random model would talk to the end of its context
    if "max_tokens" not in body and "messages" in body and path == "/v1/chat/completions":
        body["max_completion_tokens"] = min(body.get("max_completion_tokens") or 4, 4)
    if "max_output_tokens" not in body and "input" in body and "questions" not in body:
        body["max_output_tokens"] = 4


@model_routes.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, derandomize=True)
def test_model_routes_on_a_real_model(case, model_server: LiveServer) -> None:
    """The same contract with a model installed, so schema-valid requests reach the engine and must
    be answered (positive data accepted), not refused by a rule the document does not state."""
    if case.meta is not None and case.meta.generation.mode.is_positive:
        _on_the_tiny_model(case.body, case.operation.path)  # negative cases stay as generated: still invalid
    _validate(case, model_server, 120)


speech_route = schema.include(path_regex=r"^/v1/audio/speech$")
TINY_TTS = "test/tiny-kitten"


@pytest.fixture(scope="module")
def speech_server(tmp_path_factory: pytest.TempPathFactory, tiny_tts_dir: Path) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("tts-store")
    install_folder(root, TINY_TTS, tiny_tts_dir)
    server = start_server(root, root.parent / "speech-server.log")
    yield server
    server.stop()


@speech_route.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, derandomize=True)
def test_speech_on_a_real_model(case, speech_server: LiveServer) -> None:
    """Schema-valid speech requests reach the tiny KittenTTS and are synthesized (or refused by a
    stated rule). The text is cut short so each case stays quick; `instructions`, which every model
    here refuses, is left out and a voice names one the model has, so the cases reach synthesis."""
    body = case.body
    if case.meta is not None and case.meta.generation.mode.is_positive and isinstance(body, dict):
        body["model"] = TINY_TTS
        body.pop("instructions", None)
        if isinstance(body.get("voice"), dict):
            body["voice"] = {"id": "Leo"}
        elif "voice" in body:
            body["voice"] = "Bella"
        if isinstance(body.get("input"), str):
            body["input"] = body["input"][:120]
    _validate(case, speech_server, 120)
