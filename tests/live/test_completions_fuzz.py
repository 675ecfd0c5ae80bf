"""schemathesis on POST /v1/completions with a model installed: schema-valid requests reach the
engine and are answered (or refused by a rule the overlay states), responses and stream events
conform to the served document, and nothing is a 5xx. The empty-server fuzzing of every operation
(tests/live/test_fuzz_schemathesis.py) covers this route too; this adds the generations."""

from __future__ import annotations

from typing import Any

import schemathesis
from conftest import TINY_ID, stated_handler_rule
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from live_server import LiveServer
from swama.handlers.http.openapi import merged_spec

EXAMPLES = 60

completions = schemathesis.openapi.from_dict(merged_spec()).include(path_regex=r"^/v1/completions$")


def _small(body: Any) -> None:
    """The tiny random model, and a bounded amount of generation: few prompts, choices and tokens
    (random weights talk until their limit). Sizes only shrink, so a valid body stays valid."""
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str):
        body["model"] = TINY_ID
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        body["prompt"] = prompt[:3]
    for key in ("n", "best_of"):
        if isinstance(body.get(key), int) and not isinstance(body.get(key), bool):
            body[key] = min(body[key], 2)
    if isinstance(body.get("max_tokens"), int) and not isinstance(body.get("max_tokens"), bool):
        body["max_tokens"] = min(body["max_tokens"], 4)
    else:
        body["max_tokens"] = 4


def schema_valid_data_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """ST202, except for a 400 from a rule the overlay states because no schema can say it."""
    if response.status_code == 400 and stated_handler_rule("createCompletion", response.json()["error"]["message"]):
        return None
    return positive_data_acceptance(ctx, response, case)


@completions.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, derandomize=True)
def test_completions_on_a_real_model(case, model_server: LiveServer) -> None:
    if case.meta is not None and case.meta.generation.mode.is_positive:
        _small(case.body)  # negative cases stay as generated, so they stay invalid
    case.call_and_validate(base_url=model_server.url, timeout=120, excluded_checks=[positive_data_acceptance],
                           additional_checks=[schema_valid_data_accepted])
