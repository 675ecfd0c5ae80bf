"""The spec pipeline: pinned documents, the generated code's freshness, extraction and diffs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tools.spec import codegen
from tools.spec import diff as spec_diff
from tools.spec import extract as spec_extract
from tools.spec.commands import GENERATED, SPECS
from tools.spec.sources import SOURCES

pytestmark = pytest.mark.slow

SERVED = {
    "GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses", "POST /v1/embeddings",
    "POST /v1/audio/transcriptions", "POST /v1/audio/speech", "POST /v1/decisions", "POST /v1/systemone",
    *(f"POST {prefix}/accounts/{{account_id}}/ai/run/@cf/cloudflare/{model}"
      for prefix in ("/client/v4", "") for model in ("clef", "clef-flash")),
    "POST /tokenize", "POST /detokenize",
    "POST /v1/messages", "POST /v1/messages/count_tokens",
    "POST /v1/files", "GET /v1/files", "GET /v1/files/{file_id}", "DELETE /v1/files/{file_id}",
    "GET /v1/files/{file_id}/content", "POST /v1/batches", "GET /v1/batches", "GET /v1/batches/{batch_id}",
    "POST /v1/batches/{batch_id}/cancel", "POST /v1/rerank", "POST /v2/rerank", "POST /v1/score",
}


def test_generated_is_up_to_date() -> None:
    assert codegen.check(SPECS, GENERATED) == []


def test_hand_edit_of_generated_is_caught(tmp_path: Path) -> None:
    copy = tmp_path / "generated"
    shutil.copytree(GENERATED, copy)
    target = copy / "decisions_models.py"
    target.write_text(target.read_text().replace('extra="forbid"', 'extra="ignore"', 1))
    (copy / "stray.py").write_text("x = 1\n")
    assert codegen.check(SPECS, copy) == ["decisions_models.py", "stray.py"]


def test_check_command_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.spec import commands as specs

    assert specs.main(["check"]) == 0
    copy = tmp_path / "generated"
    shutil.copytree(GENERATED, copy)
    (copy / "routes.py").write_text((copy / "routes.py").read_text() + "# edited\n")
    monkeypatch.setattr(specs, "GENERATED", copy)
    assert specs.main(["check"]) == 1


def test_pins_record_every_document() -> None:
    pins = json.loads((SPECS / "pins.json").read_text())
    assert {p["document"] for p in pins} == {s.doc for s in SOURCES.values()}
    ops = set()
    for pin in pins:
        for key in ("upstream_repo", "upstream_path", "upstream_commit", "upstream_commit_date", "upstream_sha256"):
            assert pin[key], key
        assert pin["sha256"] == spec_extract.sha256_of(SPECS / pin["document"])
        ops |= set(pin["operations"])
    assert ops == SERVED
    decisions = next(p for p in pins if p["document"] == "decisions.yaml")
    assert "not available" in decisions["note"]


def test_pinned_specs_carry_no_upstream_prose() -> None:
    for name in codegen.DOCUMENTS.values():
        text = (SPECS / name).read_text()
        assert "x-oaiMeta" not in text and "x-stainless" not in text
        doc = yaml.safe_load(text)
        # Stripping again changes nothing but our own descriptions: of response statuses, and of the
        # extensions an overlay adds (x-swama-extension).
        _drop_extension_descriptions(doc)
        stripped = spec_extract.strip_prose(doc)
        for item in doc["paths"].values():
            for op in item.values():
                assert "description" not in op and "summary" not in op
                for response in op["responses"].values():
                    response.pop("description")
        for item in stripped["paths"].values():
            for op in item.values():
                for response in op["responses"].values():
                    response.pop("description", None)
        assert stripped == doc


def _drop_extension_descriptions(node: object) -> None:
    if isinstance(node, dict):
        if "x-swama-extension" in node:
            node.pop("description", None)
        for value in node.values():
            _drop_extension_descriptions(value)
    elif isinstance(node, list):
        for value in node:
            _drop_extension_descriptions(value)


def test_systemone_extensions_are_marked() -> None:
    doc = yaml.safe_load((SPECS / "systemone.yaml").read_text())
    schemas = doc["components"]["schemas"]
    request = schemas["SystemOneRequest"]["properties"]
    assert request["images"]["x-swama-extension"] == "clef"
    assert request["chat_template_kwargs"]["x-swama-extension"] == "sglang"
    for answer in ("SystemOneNoulAnswer", "SystemOneChoiceAnswer", "SystemOneScoreAnswer"):
        assert schemas[answer]["properties"]["x_label_mass"]["x-swama-extension"] == "sglang"


def test_workers_ai_document_comes_from_both_cards() -> None:
    pins = {p["document"]: p for p in json.loads((SPECS / "pins.json").read_text())}
    pin = pins["workers_ai.yaml"]
    assert pin["upstream_repo"] == "cloudflare/cloudflare-docs"
    assert pin["upstream_commit"] == "0ae61c0b72577c69ed32bf7867d2e478cee255d0"
    assert pin["upstream_sha256"] != pin["clef_flash_sha256"]
    doc = yaml.safe_load((SPECS / "workers_ai.yaml").read_text())
    schemas = doc["components"]["schemas"]
    for card in ("Clef", "ClefFlash"):
        request = schemas[f"WorkersAi{card}Request"]
        assert request["required"] == ["model", "state", "questions"]
        assert request["properties"]["questions"]["maxProperties"] == 64
        assert request["properties"]["images"]["maxItems"] == 4
        assert set(schemas[f"WorkersAi{card}Question"]["discriminator"]["mapping"]) == {"noul", "choice", "score"}
        envelope = schemas[f"WorkersAi{card}Response"]
        assert envelope["required"] == ["result", "success", "errors", "messages"]
    assert schemas["WorkersAiErrorResponse"]["properties"]["result"] == {"type": "null"}


def test_anthropic_document_is_the_pinned_sdk_s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Built from the installed anthropic SDK, which must be the pinned version: rebuilding it gives the
    pinned text and pin, whose upstream digest is the SDK's type modules'."""
    from tools.spec import anthropic_sdk

    pins = {p["document"]: p for p in json.loads((SPECS / "pins.json").read_text())}
    assert pins["anthropic.yaml"]["upstream_commit"] == anthropic_sdk.SDK.version == "2.10.0"
    assert pins["anthropic.yaml"]["upstream_sha256"] == anthropic_sdk.types_sha256()
    trial = tmp_path / "specs"
    shutil.copytree(SPECS, trial, ignore=shutil.ignore_patterns("__pycache__"))
    rebuilt = {p["document"]: p for p in spec_extract.extract_all(trial, anthropic=True)}
    assert "overlays/anthropic.yaml" not in capsys.readouterr().out  # every overlay action found its target
    assert (trial / "anthropic.yaml").read_text() == (SPECS / "anthropic.yaml").read_text()
    assert rebuilt["anthropic.yaml"] == pins["anthropic.yaml"]


def test_anthropic_extraction_refuses_another_sdk_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import anthropic

    from tools.spec import anthropic_sdk
    from tools.spec import commands as specs

    trial = tmp_path / "specs"
    shutil.copytree(SPECS, trial, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(anthropic, "__version__", "2.9.0")
    with pytest.raises(anthropic_sdk.SdkMismatch, match=r"pip install anthropic==2\.10\.0"):
        spec_extract.extract_all(trial, anthropic=True)
    with pytest.raises(SystemExit, match=r"pip install anthropic==2\.10\.0"):
        specs.main(["--specs-dir", str(trial), "extract", "--anthropic"])
    for name in ("pins.json", "anthropic.yaml", "tokenize.yaml"):  # refused before anything is written
        assert (trial / name).read_text() == (SPECS / name).read_text()


def test_cohere_document_is_the_pinned_sdk_s(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Built from the installed cohere SDK's rerank methods and answers: rebuilding it gives the pinned
    text and pin; another SDK version is refused before anything is written."""
    import cohere

    from tools.spec import cohere_sdk

    pins = {p["document"]: p for p in json.loads((SPECS / "pins.json").read_text())}
    assert pins["cohere.yaml"]["upstream_commit"] == cohere_sdk.SDK.version == "7.3.1"
    assert pins["cohere.yaml"]["upstream_sha256"] == cohere_sdk.types_sha256()
    trial = tmp_path / "specs"
    shutil.copytree(SPECS, trial, ignore=shutil.ignore_patterns("__pycache__"))
    rebuilt = {p["document"]: p for p in spec_extract.extract_all(trial, cohere=True)}
    assert "overlays/cohere.yaml" not in capsys.readouterr().out  # every overlay action found its target
    assert (trial / "cohere.yaml").read_text() == (SPECS / "cohere.yaml").read_text()
    assert rebuilt["cohere.yaml"] == pins["cohere.yaml"]
    schemas = yaml.safe_load((SPECS / "cohere.yaml").read_text())["components"]["schemas"]
    v1, v2 = schemas["CohereRerankRequest"], schemas["CohereV2RerankRequest"]
    assert v1["required"] == ["model", "query", "documents"] and v2["required"] == ["model", "query", "documents"]
    assert v2["properties"]["documents"] == {"items": {"type": "string"}, "type": "array", "minItems": 1,
                                             "maxItems": 1000}
    assert set(v1["properties"]) >= {"rank_fields", "return_documents", "max_chunks_per_doc"}
    monkeypatch.setattr(cohere, "__version__", "7.0.0")
    with pytest.raises(cohere_sdk.SdkMismatch, match=r"pip install cohere==7\.3\.1"):
        spec_extract.extract_all(tmp_path / "other", cohere=True)


def test_anthropic_document_narrowed_and_extended() -> None:
    doc = yaml.safe_load((SPECS / "anthropic.yaml").read_text())
    schemas = doc["components"]["schemas"]
    assert all(name.startswith("Anthropic") for name in schemas)
    create = schemas["AnthropicMessageCreateParams"]
    assert create["additionalProperties"] is False and create["required"] == ["max_tokens", "messages", "model"]
    assert create["properties"]["stream"] == {"type": "boolean"}
    for name in ("temperature", "top_p", "top_k"):
        assert create["properties"][name]["x-swama-extension"] == "anthropic"
    blocks = schemas["AnthropicContentBlockParam"]["discriminator"]["mapping"]
    assert set(blocks) == {"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"}
    ops = {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}
    assert ops["createMessage"]["x-swama-handler"] == "routes.messages:create_message"
    assert ops["countMessageTokens"]["x-swama-handler"] == "routes.messages:count_message_tokens"
    assert "text/event-stream" in ops["createMessage"]["responses"]["200"]["content"]
    assert {"400", "401", "404", "413", "429", "500", "503", "529"} <= set(ops["createMessage"]["responses"])
    errors = schemas["AnthropicErrorResponse"]["properties"]["error"]["discriminator"]["mapping"]
    assert {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
            "request_too_large", "rate_limit_error", "overloaded_error", "api_error"} <= set(errors)


def test_extract_needs_clef_beside_its_partners(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="need --clef"):
        spec_extract.extract_all(tmp_path, clef_flash=tmp_path / "clef-flash.json")
    with pytest.raises(ValueError, match="give at least one"):
        spec_extract.extract_all(tmp_path, clef=tmp_path / "clef.json")


UPSTREAM = {
    "openapi": "3.1.0",
    "info": {"title": "t", "version": "1", "description": "long prose"},
    "paths": {
        "/things": {"post": {
            "operationId": "createThing", "summary": "prose",
            "x-oaiMeta": {"examples": {"curl": "..."}},
            "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Req"}}}},
            "responses": {"200": {"description": "OK", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Tool"}}}}, "429": {"description": "slow down"}},
        }},
        "/unused": {"get": {"operationId": "unused", "responses": {"200": {"description": "OK"}}}},
    },
    "components": {"schemas": {
        "Req": {"type": "object", "description": "prose", "properties": {
            "description": {"type": "string", "description": "a field really called description"},
            "filter": {"$ref": "#/components/schemas/Compound"}}},
        "Compound": {"type": "object", "properties": {"filters": {"type": "array", "items": {
            "anyOf": [{"$ref": "#/components/schemas/Leaf"}, {"$recursiveRef": "#"}]}}}},
        "Leaf": {"type": "object", "properties": {"type": {"type": "string", "enum": ["eq", "ne"]}}},
        "Tool": {"oneOf": [{"$ref": "#/components/schemas/Search"}, {"$ref": "#/components/schemas/Fn"}],
                 "discriminator": {"propertyName": "type"}},
        "Search": {"type": "object", "properties": {"type": {"type": "string",
                                                             "enum": ["web_search", "web_search_2025"]}}},
        "Fn": {"type": "object", "properties": {"type": {"type": "string", "const": "function"}}},
        "Orphan": {"type": "object"},
        "ErrorResponse": {"type": "object"},
    }},
}


def test_extraction_on_a_small_upstream_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.spec.sources import Operation, Source

    upstream = tmp_path / "up.yaml"
    upstream.write_text(yaml.safe_dump(UPSTREAM))
    source = Source(doc="x.yaml", repo="o/r", path="up.yaml", commit="abc", commit_date="2026-01-01",
                    operations=(Operation("post", "/things", "/v1/things", "things:create"),))
    doc = spec_extract.load_document(upstream)
    paths = spec_extract.build_operations(doc, source)
    components = spec_extract.reachable_components(doc, [paths])
    out = spec_extract._finish(source, spec_extract._document(source, paths, components, "t", "1"))
    schemas = out["components"]["schemas"]
    assert set(schemas) == {"Req", "Compound", "Leaf", "Tool", "Search", "Fn", "ErrorResponse"}
    assert list(out["paths"]) == ["/v1/things"]
    op = out["paths"]["/v1/things"]["post"]
    assert "summary" not in op and "x-oaiMeta" not in op
    assert op["x-swama-handler"] == "things:create"
    assert {"200", "400", "404", "413", "429", "500", "503"} <= set(op["responses"]) and "501" not in op["responses"]
    # A property named `description` survives while prose descriptions go.
    assert "description" not in schemas["Req"]
    assert schemas["Req"]["properties"]["description"] == {"type": "string"}
    assert schemas["Compound"]["properties"]["filters"]["items"]["anyOf"][1] == {
        "$ref": "#/components/schemas/Compound"}
    assert schemas["Tool"]["discriminator"]["mapping"] == {
        "web_search": "#/components/schemas/Search", "web_search_2025": "#/components/schemas/Search",
        "function": "#/components/schemas/Fn"}


def test_spec_diff_reports_added_removed_and_retyped_fields() -> None:
    old = {"paths": {"/a": {"post": {}}}, "components": {"schemas": {
        "A": {"type": "object", "required": ["x"], "properties": {
            "x": {"type": "string"}, "y": {"type": "integer"}, "z": {"type": "number", "maximum": 2}}},
        "Gone": {"type": "object"}}}}
    new = {"paths": {"/a": {"post": {}}, "/b": {"get": {}}}, "components": {"schemas": {
        "A": {"type": "object", "required": ["w"], "properties": {
            "x": {"type": "integer"}, "w": {"$ref": "#/components/schemas/B"},
            "z": {"type": "number", "maximum": 3}}},
        "B": {"type": "object"}}}}
    lines = spec_diff.diff_documents(old, new)
    assert lines == [
        "+ operation GET /b",
        "+ schema B",
        "- schema Gone",
        "~ schema A",
        "    + w: B (required)",
        "    - y: integer",
        "    ~ x: string -> integer",
        "    ~ x: now optional",
        "    ~ z: constraints changed",
    ]


def test_diff_command_prints_schema_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.spec import commands as specs

    old = tmp_path / "old"
    shutil.copytree(SPECS, old)
    doc = yaml.safe_load((old / "decisions.yaml").read_text())
    del doc["components"]["schemas"]["DecisionCreateRequest"]["properties"]["safety_identifier"]
    (old / "decisions.yaml").write_text(yaml.safe_dump(doc))
    specs.main(["diff", str(old)])
    out = capsys.readouterr().out
    assert "~ schema DecisionCreateRequest" in out and "+ safety_identifier: string | null" in out
    assert "== openai.yaml: no schema changes" in out


def test_the_served_document_states_every_handler_rule_of_the_overlays() -> None:
    """A rule no schema can say is still stated: its refusal's pattern sits on its operation in
    /openapi.json (x-swama-handler-rules), copied from the overlay at extraction."""
    from swama.handlers.http.openapi import merged_spec

    served = {op["operationId"]: op.get("x-swama-handler-rules", [])
              for item in merged_spec()["paths"].values() for op in item.values()}
    for overlay in sorted((SPECS / "overlays").glob("*.yaml")):
        for operation_id, patterns in (yaml.safe_load(overlay.read_text()).get("x-swama-handler-rules") or {}).items():
            assert served[operation_id] == patterns, (overlay.name, operation_id)
