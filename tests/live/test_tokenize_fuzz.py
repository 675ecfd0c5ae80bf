"""schemathesis on /tokenize and /detokenize with a model installed: generated requests reach the
tokenizer, so a schema-valid one must be answered (or refused by a rule the served document states),
never a 5xx, and every answer must match the documented response. tests/live/test_fuzz_schemathesis.py
covers the two routes on a server with no models; this is the half that needs one."""

from __future__ import annotations

from typing import Any

import schemathesis
from conftest import stated_handler_rule
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from live_server import LiveServer
from swama.handlers.http.openapi import merged_spec

TINY = "test/tiny-qwen3"
EXAMPLES = 60  # per operation; derandomized, so CI runs the same cases every time

routes = schemathesis.openapi.from_dict(merged_spec()).include(path_regex=r"^/(de)?tokenize$")


def schema_valid_data_accepted(ctx: Any, response: Any, case: Any) -> Any:
    """ST202, except for a 400 from a rule the overlay states because no schema can say it."""
    if response.status_code == 400:
        if stated_handler_rule(case.operation.definition.raw["operationId"], response.json()["error"]["message"]):
            return None
    return positive_data_acceptance(ctx, response, case)


@routes.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, derandomize=True)
def test_tokenizer_routes_on_a_real_model(case: Any, model_server: LiveServer) -> None:
    if case.meta is not None and case.meta.generation.mode.is_positive and isinstance(case.body, dict):
        case.body["model"] = TINY  # negative cases stay as generated, so they stay invalid
    case.call_and_validate(base_url=model_server.url, timeout=120, excluded_checks=[positive_data_acceptance],
                           additional_checks=[schema_valid_data_accepted])
