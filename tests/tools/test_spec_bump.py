"""A spec bump end to end, on a trial copy of specs/ and generated/: a modified upstream document is
re-extracted (overlays applied), regenerated and diffed, and the regenerated model meets the route's
rules at run time: a new optional field is refused by an explicit rule, a removed one is unknown."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from swama.engine.decisions.scorer import DecisionError
from swama.generated.routes import OPERATIONS
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import resolve, rules_of, validate
from tools.spec import commands as specs
from tools.spec.sources import DECISIONS

NEW_FIELD = "x_trial_field"
REMOVED_FIELD = "safety_identifier"
REQUEST = {"model": "m", "input": "text", "questions": [{"type": "predicate", "instructions": "Is it?"}]}


def _upstream_from_pin(pinned: Path, out: Path) -> None:
    """The pinned decisions document put back into its upstream shape, then changed as a bump would."""
    doc = yaml.safe_load(pinned.read_text())
    (op,) = DECISIONS.operations
    doc["paths"] = {op.upstream_path: doc["paths"][op.path]}
    request = doc["components"]["schemas"]["DecisionCreateRequest"]
    request["properties"][NEW_FIELD] = {"type": ["string", "null"], "description": "a new optional field"}
    del request["properties"][REMOVED_FIELD]
    out.write_text(yaml.safe_dump(doc, sort_keys=False))


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bumped_decisions_models", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves generic models through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bumped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("bump")
    trial_specs, trial_generated = root / "specs", root / "generated"
    shutil.copytree(specs.SPECS, trial_specs, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(specs.GENERATED, trial_generated, ignore=shutil.ignore_patterns("__pycache__"))
    upstream = root / "decisions-upstream.yaml"
    _upstream_from_pin(specs.SPECS / "decisions.yaml", upstream)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = specs.main(["--specs-dir", str(trial_specs), "--generated-dir", str(trial_generated),
                           "bump", "--decisions", str(upstream), "--no-tests"])
    assert code == 0, buffer.getvalue()
    return trial_specs, trial_generated, buffer.getvalue()


def test_bump_prints_the_schema_diff(bumped: tuple[Path, Path, str]) -> None:
    _, _, out = bumped
    assert "== decisions.yaml: changed" in out
    assert "~ schema DecisionCreateRequest" in out
    assert f"+ {NEW_FIELD}: string | null" in out
    assert f"- {REMOVED_FIELD}:" in out
    for name in ("openai.yaml", "systemone.yaml", "workers_ai.yaml", "anthropic.yaml"):
        assert f"== {name}: no schema changes" in out
    for overlay in sorted((specs.SPECS / "overlays").glob("*.yaml")):
        if overlay.name == "decisions.yaml":
            assert "== overlays/decisions.yaml: unchanged since the last pin" in out


def test_bump_records_the_new_pin(bumped: tuple[Path, Path, str]) -> None:
    trial_specs, _, _ = bumped
    old = {p["document"]: p for p in json.loads((specs.SPECS / "pins.json").read_text())}
    new = {p["document"]: p for p in json.loads((trial_specs / "pins.json").read_text())}
    for name in ("openai.yaml", "systemone.yaml", "workers_ai.yaml", "anthropic.yaml"):
        assert new[name] == old[name]
    assert new["decisions.yaml"]["upstream_sha256"] != old["decisions.yaml"]["upstream_sha256"]
    assert new["decisions.yaml"]["sha256"] != old["decisions.yaml"]["sha256"]
    assert (trial_specs / "decisions.yaml").read_text() != (specs.SPECS / "decisions.yaml").read_text()


def test_the_regenerated_model_meets_the_route_rules(bumped: tuple[Path, Path, str]) -> None:
    _, trial_generated, _ = bumped
    models = _load(trial_generated / "decisions_models.py")
    model = models.DecisionCreateRequest
    assert NEW_FIELD in model.model_fields and REMOVED_FIELD not in model.model_fields
    rules = rules_of(resolve(OPERATIONS["createDecision"].handler))
    assert validate(model, rules, REQUEST).model == "m"  # unchanged requests still parse
    # The new field parses, and the route refuses it by name rather than ignore it.
    with pytest.raises((ApiError, DecisionError)) as refused:
        validate(model, rules, {**REQUEST, NEW_FIELD: "x"})
    assert refused.value.status == 400 and NEW_FIELD in refused.value.message
    # The removed field is now unknown to the model itself.
    with pytest.raises((ApiError, DecisionError)) as unknown:
        validate(model, rules, {**REQUEST, REMOVED_FIELD: "user-1"})
    assert unknown.value.status == 400 and REMOVED_FIELD in unknown.value.message


def test_the_trial_tree_is_consistent(bumped: tuple[Path, Path, str]) -> None:
    trial_specs, trial_generated, _ = bumped
    assert specs.main(["--specs-dir", str(trial_specs), "--generated-dir", str(trial_generated), "check"]) == 0
    # The real tree was not touched.
    assert specs.main(["check"]) == 0
