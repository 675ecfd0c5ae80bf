"""Turn upstream API descriptions into the pinned documents under specs/.

Each document keeps only the operations we serve and the components they reach, loses upstream
prose (descriptions, summaries, examples, vendor metadata), gains the error responses we answer
with, and is pre-processed so datamodel-code-generator reads it correctly (explicit discriminator
mappings, no $recursiveRef).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from tools.spec import anthropic_sdk, cohere_sdk
from tools.spec import overlay as spec_overlay
from tools.spec.sources import (
    ANTHROPIC,
    COHERE,
    DECISIONS,
    OPENAI,
    SCORE,
    SCORE_DOCUMENT,
    SYSTEMONE,
    TOKENIZE,
    TOKENIZE_DOCUMENT,
    WORKERS_AI,
    Source,
)

# Keys that carry prose or vendor metadata rather than structure.
PROSE_KEYS = {"description", "summary", "example", "examples", "externalDocs", "tags", "x-oaiMeta",
              "x-oaiExpandable", "x-oaiTypeLabel", "deprecated", "termsOfService", "contact",
              "x-source", "x-stainless-const", "x-stainless-naming", "x-stainless-go-variant-constructor"}
# Keys whose children are names (property names, status codes, media types), not keywords.
NAME_MAP_KEYS = {"properties", "patternProperties", "$defs", "schemas", "responses", "content", "paths",
                 "securitySchemes", "headers", "encoding", "dependentSchemas", "requestBodies"}

EXTENSION = "x-swama-extension"
HANDLER = "x-swama-handler"


def load_document(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def strip_prose(node: Any, names: bool = False) -> Any:
    """Drop prose keywords, keeping property names such as a field called `description`."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if not names and (key in PROSE_KEYS or key.startswith("x-oai") or key.startswith("x-stainless")):
                continue
            out[key] = strip_prose(value, names=(not names and key in NAME_MAP_KEYS))
        return out
    if isinstance(node, list):
        return [strip_prose(item) for item in node]
    return node


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                found.add(value)
            else:
                found |= _refs(value)
    elif isinstance(node, list):
        for item in node:
            found |= _refs(item)
    return found


def _component(doc: dict[str, Any], ref: str) -> tuple[str, str]:
    match = re.fullmatch(r"#/components/([^/]+)/(.+)", ref)
    if not match:
        raise ValueError(f"unsupported $ref {ref!r}")
    section, name = match.groups()
    if name not in doc.get("components", {}).get(section, {}):
        raise ValueError(f"$ref {ref!r} points at nothing")
    return section, name


def reachable_components(doc: dict[str, Any], roots: list[Any]) -> dict[str, dict[str, Any]]:
    """Every component reachable from `roots`, by section."""
    seen: dict[str, dict[str, Any]] = {}
    todo = set().union(*(_refs(r) for r in roots)) if roots else set()
    while todo:
        ref = todo.pop()
        section, name = _component(doc, ref)
        if name in seen.get(section, {}):
            continue
        body = doc["components"][section][name]
        seen.setdefault(section, {})[name] = body
        todo |= _refs(body)
    return seen


def replace_recursive_refs(schemas: dict[str, Any]) -> None:
    """`$recursiveRef: '#'` means "this schema"; the generator needs a plain $ref."""

    def walk(node: Any, owner: str) -> Any:
        if isinstance(node, dict):
            if node.get("$recursiveRef") == "#":
                return {"$ref": f"#/components/schemas/{owner}"}
            return {k: walk(v, owner) for k, v in node.items() if k != "$recursiveAnchor"}
        if isinstance(node, list):
            return [walk(v, owner) for v in node]
        return node

    for name in list(schemas):
        schemas[name] = walk(schemas[name], name)


def _tag_values(schemas: dict[str, Any], schema: dict[str, Any], prop: str, depth: int = 0) -> list[str]:
    if depth > 8:
        return []
    if "$ref" in schema:
        target = schemas.get(schema["$ref"].rsplit("/", 1)[-1], {})
        return _tag_values(schemas, target, prop, depth + 1)
    spec = schema.get("properties", {}).get(prop)
    if isinstance(spec, dict):
        if "$ref" in spec:
            spec = schemas.get(spec["$ref"].rsplit("/", 1)[-1], {})
        if "const" in spec:
            return [spec["const"]]
        if "enum" in spec:
            return [v for v in spec["enum"] if isinstance(v, str)]
    values: list[str] = []
    for part in schema.get("allOf", []):
        values += _tag_values(schemas, part, prop, depth + 1)
    return values


def add_discriminator_mappings(schemas: dict[str, Any]) -> int:
    """Give every discriminated union an explicit mapping entry for every tag value.

    Without one, the generator names a variant's tag after its class, so a variant whose tag has
    several values (web_search | web_search_2025_08_26) accepts none of them.
    """
    changed = 0

    def walk(node: Any) -> None:
        nonlocal changed
        if isinstance(node, dict):
            disc = node.get("discriminator")
            variants = node.get("oneOf") or node.get("anyOf")
            if isinstance(disc, dict) and variants:
                mapping = dict(disc.get("mapping", {}))
                for variant in variants:
                    ref = variant.get("$ref")
                    if not ref:
                        continue
                    for value in _tag_values(schemas, variant, disc["propertyName"]):
                        if value not in mapping:
                            mapping[value] = ref
                            changed += 1
                if mapping:
                    disc["mapping"] = mapping
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schemas)
    return changed


def rename_components(doc: dict[str, Any], prefix: str) -> None:
    """Prefix component names so several documents merge without collisions."""
    if not prefix:
        return
    schemas = doc["components"]["schemas"]
    renames = {n: n if n.startswith(prefix) else prefix + n for n in schemas}
    doc["components"]["schemas"] = {renames[n]: body for n, body in schemas.items()}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key in ("$ref",) and isinstance(value, str) and value.startswith("#/components/schemas/"):
                    out[key] = "#/components/schemas/" + renames[value.rsplit("/", 1)[-1]]
                elif key == "mapping" and isinstance(value, dict):
                    out[key] = {k: "#/components/schemas/" + renames[v.rsplit("/", 1)[-1]] for k, v in value.items()}
                else:
                    out[key] = walk(value)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    doc["paths"] = walk(doc["paths"])
    doc["components"]["schemas"] = walk(doc["components"]["schemas"])


ERROR_STATUSES = {
    "400": "Bad request",
    "401": "Missing or wrong API key",
    "404": "Not found: a model that is not installed, or an id this server does not hold",
    "413": "Request body too large",
    "429": "Too many requests waiting; retry after the Retry-After header's seconds",
    "500": "Server failure",
    "503": "Unavailable for now: the model timed out or is unloading, or the server lacks what the route needs",
}
# Anthropic's own status for an overloaded API (its clients retry it as they retry a 503).
ANTHROPIC_ERROR_STATUSES = {**ERROR_STATUSES, "529": "Overloaded"}
STATUS_TEXT = {**ERROR_STATUSES, **ANTHROPIC_ERROR_STATUSES}  # every error status's description, in any document


def _error_responses(schema: str, statuses: dict[str, str]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {code: {"description": text, "content": {"application/json": {"schema": ref}}}
            for code, text in statuses.items()}


def build_operations(doc: dict[str, Any], source: Source,
                     statuses_served: dict[str, str] | None = None) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for op in source.operations:
        upstream = copy.deepcopy(doc["paths"][op.upstream_path][op.method])
        upstream.pop("security", None)
        upstream.pop("parameters", None) if op.method == "get" and not upstream.get("parameters") else None
        if op.operation_id:
            upstream["operationId"] = op.operation_id
        ok = {code: body for code, body in upstream["responses"].items() if code.startswith("2")}
        statuses = dict(statuses_served or ERROR_STATUSES)
        if op.errors is not None:
            statuses = {k: v for k, v in statuses.items() if k in op.errors}
        elif op.method == "get":
            statuses = {k: v for k, v in statuses.items() if k in ("401", "500")}
        ok.update(_error_responses(op.error_schema, statuses))
        upstream["responses"] = ok
        upstream[HANDLER] = op.handler
        paths.setdefault(op.path, {})[op.method] = upstream
    return paths


def _document(source: Source, paths: dict[str, Any], components: dict[str, Any], title: str,
              version: str) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": components,
    }


def _finish(source: Source, doc: dict[str, Any]) -> dict[str, Any]:
    doc = strip_prose(doc)
    # Our own descriptions of error statuses are not upstream prose; put them back.
    for item in doc["paths"].values():
        for op in item.values():
            for code, body in op["responses"].items():
                if code in STATUS_TEXT:
                    body["description"] = STATUS_TEXT[code]
                elif "description" not in body:
                    body["description"] = "OK"
    schemas = doc["components"]["schemas"]
    replace_recursive_refs(schemas)
    add_discriminator_mappings(schemas)
    rename_components(doc, source.component_prefix)
    return doc


def extract_openai(upstream: Path) -> dict[str, Any]:
    doc = load_document(upstream)
    paths = build_operations(doc, OPENAI)
    components = reachable_components(doc, [paths])
    schemas = components.setdefault("schemas", {})
    for name in ("ErrorResponse", "Error"):
        schemas[name] = doc["components"]["schemas"][name]
    out = _document(OPENAI, paths, {"schemas": dict(sorted(schemas.items()))}, "swama: OpenAI-compatible routes",
                    str(doc["info"]["version"]))
    return _finish(OPENAI, out)


def extract_decisions(upstream: Path) -> dict[str, Any]:
    doc = load_document(upstream)
    schemas = doc["components"]["schemas"]
    for name in ("ErrorResponse", "Error"):
        schemas.pop(name, None)
    # The route's documented error envelope: {"error": {"message", "type"}}.
    schemas["ErrorResponse"] = {
        "type": "object", "required": ["error"], "additionalProperties": False,
        "properties": {"error": {
            "type": "object", "required": ["message", "type"], "additionalProperties": False,
            "properties": {"message": {"type": "string"}, "type": {"type": "string"}},
        }},
    }
    for op in DECISIONS.operations:
        doc["paths"][op.upstream_path][op.method]["responses"].pop("400", None)
    paths = build_operations(doc, DECISIONS)
    components = reachable_components(doc, [paths])
    # Answers are never refusals on this server, but the pinned shape keeps the variant.
    out = _document(DECISIONS, paths, {"schemas": dict(sorted(components["schemas"].items()))},
                    "swama: OpenAI Decisions", "4a4020d8")
    return _finish(DECISIONS, out)


def extract_systemone(upstream: Path, clef: Path) -> dict[str, Any]:
    doc = load_document(upstream)
    schemas = doc["components"]["schemas"]
    clef_input = load_document(clef)["schema"]["input"]
    request = schemas["SystemOneRequest"]
    request["properties"]["images"] = dict(clef_input["properties"]["images"], **{EXTENSION: "clef"})
    request["properties"]["chat_template_kwargs"] = {
        EXTENSION: "sglang",
        "type": "object",
        "additionalProperties": False,
        "properties": {"enable_thinking": {"const": False}},
    }
    for name in ("NoulAnswer", "ChoiceAnswer", "ScoreAnswer"):
        schemas[name]["properties"]["x_label_mass"] = {"type": "number", EXTENSION: "sglang"}
    # The server refuses unknown keys inside a question and inside noul criteria.
    for name in ("NoulQuestion", "ChoiceQuestion", "ScoreQuestion", "NoulCriteria"):
        schemas[name]["additionalProperties"] = False
    schemas["ErrorResponse"] = {
        "type": "object", "required": ["error", "detail"],
        "properties": {
            "error": {"type": "object", "required": ["message", "type"],
                      "properties": {"message": {"type": "string"}, "type": {"type": "string"}}},
            "detail": {"type": "object", "required": ["error_type", "message"],
                       "properties": {"error_type": {"type": "string"}, "message": {"type": "string"}}},
        },
    }
    paths = build_operations(doc, SYSTEMONE)
    components = reachable_components(doc, [paths])
    out = _document(SYSTEMONE, paths, {"schemas": dict(sorted(components["schemas"].items()))},
                    "swama: System One", str(doc["info"]["version"]))
    return _finish(SYSTEMONE, out)


def _camel(text: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", text) if part)


def _hoist_union(schemas: dict[str, Any], node: dict[str, Any], union: str, suffix: str) -> dict[str, str]:
    """Name a card's inline oneOf of titled, `type`-tagged objects: each member becomes a component,
    the union a discriminated one, so the generator makes one class per member and the tag picks it."""
    card = union.removesuffix(suffix)
    mapping = {}
    for member in node.pop("oneOf"):
        (tag,) = member["properties"]["type"]["enum"]
        name = card + _camel(member["title"].removesuffix(suffix.lower()).strip()) + suffix
        schemas[name] = member
        mapping[tag] = f"#/components/schemas/{name}"
    schemas[union] = {"oneOf": [{"$ref": ref} for ref in mapping.values()],
                      "discriminator": {"propertyName": "type", "mapping": mapping}}
    node["$ref"] = f"#/components/schemas/{union}"
    return mapping


def _card_components(card: dict[str, Any], name: str) -> dict[str, Any]:
    """A Workers AI model card's request and answer schemas as OpenAPI components named after it."""
    schemas: dict[str, Any] = {}
    request, result = copy.deepcopy(card["schema"]["input"]), copy.deepcopy(card["schema"]["output"])
    result.pop("contentType", None)
    _hoist_union(schemas, request["properties"]["questions"]["additionalProperties"], f"{name}Question",
                 "Question")
    _hoist_union(schemas, result["properties"]["answers"]["additionalProperties"], f"{name}Answer", "Answer")
    schemas[f"{name}Request"] = request
    schemas[f"{name}Result"] = result
    schemas[f"{name}Response"] = {
        "type": "object", "required": ["result", "success", "errors", "messages"],
        "properties": {
            "result": {"$ref": f"#/components/schemas/{name}Result"},
            "success": {"const": True},
            "errors": {"type": "array", "maxItems": 0, "items": {"$ref": "#/components/schemas/Message"}},
            "messages": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
        },
    }
    return schemas


# Cloudflare's v4 envelope: every answer says success, errors and messages; a refusal has no result.
V4_MESSAGE = {"type": "object", "required": ["code", "message"],
              "properties": {"code": {"type": "integer"}, "message": {"type": "string"}}}
V4_ERROR = {
    "type": "object", "required": ["result", "success", "errors", "messages"],
    "properties": {
        "result": {"type": "null"},
        "success": {"const": False},
        "errors": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
        "messages": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
    },
}


def extract_workers_ai(clef: Path, clef_flash: Path) -> dict[str, Any]:
    cards = {"@cf/cloudflare/clef": load_document(clef), "@cf/cloudflare/clef-flash": load_document(clef_flash)}
    schemas: dict[str, Any] = {"Message": V4_MESSAGE, "ErrorResponse": V4_ERROR}
    paths: dict[str, Any] = {}
    for op in WORKERS_AI.operations:
        card = cards[op.upstream_path]
        if card["name"] != op.upstream_path:
            raise ValueError(f"the card for {op.upstream_path} names itself {card['name']!r}")
        name = _camel(card["name"].rsplit("/", 1)[-1])
        schemas.update(_card_components(card, name))
        ok = {"200": {"content": {"application/json": {"schema": {
            "$ref": f"#/components/schemas/{name}Response"}}}}}
        # Workers AI answers a model it does not have with "No such model" (5007), a 400, not a 404.
        statuses = {k: v for k, v in ERROR_STATUSES.items() if k != "404"}
        paths[op.path] = {"post": {
            "operationId": op.operation_id,
            "parameters": [{"name": "account_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "$ref": f"#/components/schemas/{name}Request"}}}},
            "responses": {**ok, **_error_responses(op.error_schema, statuses)},
            HANDLER: op.handler,
        }}
    out = _document(WORKERS_AI, paths, {"schemas": dict(sorted(schemas.items()))},
                    "swama: Cloudflare Workers AI (Clef)", WORKERS_AI.commit[:8])
    return _finish(WORKERS_AI, out)


def extract_written(source: Source, document: Path, openai: Path, title: str) -> dict[str, Any]:
    """Our own document of vLLM's routes (tokenizer, score), completed with the components it names but
    does not define (the chat route's messages and tools, the error envelope), copied from the pinned
    openai.yaml under their own names: the served document then holds one copy of each, and a copy
    that drifted from the chat route's would stop /openapi.json from merging rather than pass unseen."""
    doc = load_document(document)
    own = doc["components"]["schemas"]
    chat = load_document(openai)["components"]["schemas"]
    if clash := sorted(set(own) & set(chat)):
        raise ValueError(f"{document.name} defines components openai.yaml has: {clash}")
    paths = build_operations(doc, source)
    doc["components"]["schemas"] = {**chat, **own}  # resolve against both; only what is reached is kept
    components = reachable_components(doc, [paths])
    out = _document(source, paths, {"schemas": dict(sorted(components["schemas"].items()))}, title,
                    str(doc["info"]["version"]))
    return _finish(source, out)


def extract_tokenize(document: Path, openai: Path) -> dict[str, Any]:
    return extract_written(TOKENIZE, document, openai, "swama: vLLM tokenizer routes")


def extract_score(document: Path, openai: Path) -> dict[str, Any]:
    return extract_written(SCORE, document, openai, "swama: vLLM score route")


def extract_anthropic() -> dict[str, Any]:
    """Anthropic's Messages routes, from the types of the installed anthropic SDK (which must be the
    pinned version): see tools/spec/anthropic_sdk.py."""
    doc = anthropic_sdk.build_document()
    paths = build_operations(doc, ANTHROPIC, ANTHROPIC_ERROR_STATUSES)
    components = reachable_components(doc, [paths])
    out = _document(ANTHROPIC, paths, {"schemas": dict(sorted(components["schemas"].items()))},
                    "swama: Anthropic Messages", str(doc["info"]["version"]))
    return _finish(ANTHROPIC, out)


def extract_cohere() -> dict[str, Any]:
    """Cohere's rerank routes, from the installed cohere SDK (the pinned version): see
    tools/spec/cohere_sdk.py."""
    doc = cohere_sdk.build_document()
    paths = build_operations(doc, COHERE)
    components = reachable_components(doc, [paths])
    out = _document(COHERE, paths, {"schemas": dict(sorted(components["schemas"].items()))},
                    "swama: Cohere Rerank", str(doc["info"]["version"]))
    return _finish(COHERE, out)


def keep_reached(doc: dict[str, Any]) -> None:
    """Drop the components no operation reaches (once an overlay has cut them off)."""
    reached = reachable_components(doc, [doc["paths"]]).get("schemas", {})
    doc["components"]["schemas"] = {n: b for n, b in sorted(doc["components"]["schemas"].items()) if n in reached}


def pin_record(source: Source, upstream: Path | None, produced: Path, extra: dict[str, Path],
               upstream_sha256: str | None = None) -> dict[str, Any]:
    """`upstream_sha256` stands for the upstream file's digest where there is no one file (the SDK)."""
    record: dict[str, Any] = {
        "document": source.doc,
        "upstream_repo": source.repo,
        "upstream_path": source.path,
        "upstream_commit": source.commit,
        "upstream_commit_date": source.commit_date,
        "upstream_sha256": upstream_sha256 or sha256_of(upstream),
        "sha256": sha256_of(produced),
        "operations": [f"{op.method.upper()} {op.path}" for op in source.operations],
    }
    if source.note:
        record["note"] = source.note
    for name, path in extra.items():
        record[f"{name}_sha256"] = sha256_of(path)
    return record


def dump_yaml(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, sort_keys=False, allow_unicode=True, width=100,
                     Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper))


def extract_all(specs_dir: Path, openai: Path | None = None, decisions: Path | None = None,
                systemone: Path | None = None, clef: Path | None = None,
                clef_flash: Path | None = None, tokenize: Path | None = None,
                anthropic: bool = False, cohere: bool = False) -> list[dict]:
    """Write specs/*.yaml and specs/pins.json from the upstream files given; a document whose upstream
    file is not given keeps its pinned text and pin record. Returns the pin records.

    `anthropic` rebuilds the Anthropic Messages document from the installed anthropic SDK (no file:
    the package is the upstream, and must be the pinned version); `cohere` the Cohere rerank document
    from the installed cohere SDK, alike.

    The tokenizer routes' document is ours and lives in the repository (`tokenize` overrides it for a
    trial), so it is rebuilt on every extraction: its copies of openai.yaml's components then follow
    any change to that document in the same run."""
    if clef is None and (systemone is not None or clef_flash is not None):
        raise ValueError("the System One and Workers AI documents need --clef (clef.json)")
    if clef is not None and systemone is None and clef_flash is None:
        raise ValueError("--clef feeds the System One document (with --systemone) and the Workers AI "
                         "one (with --clef-flash): give at least one of them")
    if anthropic:
        anthropic_sdk.check_version()  # before any document is written
    if cohere:
        cohere_sdk.check_version()
    specs_dir.mkdir(parents=True, exist_ok=True)
    pins_path = specs_dir / "pins.json"
    old_pins = {p["document"]: p for p in json.loads(pins_path.read_text())} if pins_path.exists() else {}
    jobs = [
        (OPENAI, openai, lambda: extract_openai(openai), {}),
        (DECISIONS, decisions, lambda: extract_decisions(decisions), {}),
        (SYSTEMONE, systemone, lambda: extract_systemone(systemone, clef), {"clef": clef}),
        (WORKERS_AI, clef_flash, lambda: extract_workers_ai(clef, clef_flash), {"clef_flash": clef_flash}),
    ]
    openai_pinned = specs_dir / OPENAI.doc
    if tokenize is None and (openai is not None or openai_pinned.exists()):
        tokenize = TOKENIZE_DOCUMENT
    jobs.append((TOKENIZE, tokenize, lambda: extract_tokenize(tokenize, openai_pinned), {"openai": openai_pinned}))
    score = SCORE_DOCUMENT if tokenize is not None else None  # ours too: rebuilt with the tokenizer's
    jobs.append((SCORE, score, lambda: extract_score(SCORE_DOCUMENT, openai_pinned), {"openai": openai_pinned}))
    jobs.append((ANTHROPIC, anthropic or None, extract_anthropic, {}))
    jobs.append((COHERE, cohere or None, extract_cohere, {}))
    pins = []
    for source, upstream, build, extra in jobs:
        if upstream is None:
            if source.doc not in old_pins:
                raise ValueError(f"specs/{source.doc} has no pin yet: give its upstream file")
            pins.append(old_pins[source.doc])
            continue
        target = specs_dir / source.doc
        doc = build()
        overlay = spec_overlay.overlay_path(specs_dir, source.doc)
        for note in spec_overlay.apply_overlay_file(doc, overlay):
            print(f"overlays/{source.doc}: {note}")
        add_discriminator_mappings(doc["components"]["schemas"])  # for unions the overlay added
        if source.keep_only_reached:
            keep_reached(doc)
        target.write_text(dump_yaml(doc), encoding="utf-8")
        if source is ANTHROPIC or source is COHERE:
            sdk = anthropic_sdk if source is ANTHROPIC else cohere_sdk
            record = pin_record(source, None, target, extra, upstream_sha256=sdk.types_sha256())
        else:
            # The Workers AI document's first upstream file is clef.json; clef-flash.json is its extra.
            record = pin_record(source, clef if source is WORKERS_AI else upstream, target, extra)
        if overlay.exists():
            record["overlay"] = f"overlays/{source.doc}"
            record["overlay_sha256"] = sha256_of(overlay)
        pins.append(record)
    pins_path.write_text(json.dumps(pins, indent=2) + "\n", encoding="utf-8")
    return pins
