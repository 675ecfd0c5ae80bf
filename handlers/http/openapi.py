"""The OpenAPI document served at /openapi.json: the pinned specs of every route family, merged.

It is exactly what the routes accept (the specs are narrowed by their overlays), so a contract
tester reading it sees the truth; `family_for` tells which family's error envelope a path answers in.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import yaml

from swama.generated.routes import OPERATIONS
from swama.handlers.http.version import package_version

SPEC_FILES = ("openai.yaml", "decisions.yaml", "systemone.yaml", "workers_ai.yaml", "tokenize.yaml", "anthropic.yaml",
              "cohere.yaml", "score.yaml")
# Anthropic's Messages API: /v1/messages and whatever lies under it (count_tokens, and the batches and
# other routes not served here) answer in Anthropic's envelope.
ANTHROPIC_PATH = "/v1/messages"


# What every route applies before its own rules (handlers/http/origins.py, pipeline.py, app.py).
SERVER_RULES = (
    "Rules every route applies before its own. A request body must carry the media type its operation "
    "lists (application/json, or multipart/form-data for uploads); any other type, or none, is a 415. The Host "
    "header must name the server's bound address, a loopback name (localhost, 127.0.0.1, ::1) or a host of "
    "--allowed-hosts (any IP address too when the server listens on every address); any other is a 400. A request "
    "carrying an Origin header other than the server's own is a 403 unless --cors-origins lists that origin, and "
    "CORS preflights are answered only for the listed origins. With --api-key set, every route, /metrics and "
    "/openapi.json need the key; /health answers without it with its status alone, and the playground's static "
    "page (/ and /ui/) holds no data.")


@functools.cache
def merged_spec() -> dict[str, Any]:
    """One OpenAPI document for every route we serve, built from the pinned specs."""
    merged: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "swama", "version": package_version(), "description": SERVER_RULES},
        "paths": {},
        "components": {"schemas": {}},
    }
    folder = resources.files("swama.specs")
    for name in SPEC_FILES:
        doc = yaml.load(folder.joinpath(name).read_text(encoding="utf-8"),
                        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        for path, item in doc["paths"].items():
            merged["paths"].setdefault(path, {}).update(item)
        for schema, body in doc["components"]["schemas"].items():
            if schema in merged["components"]["schemas"] and merged["components"]["schemas"][schema] != body:
                raise RuntimeError(f"component {schema} differs between pinned specs")
            merged["components"]["schemas"][schema] = body
    for item in merged["paths"].values():
        for op in item.values():
            responses = op.get("responses", {}) if isinstance(op, dict) and "requestBody" in op else {}
            if "400" in responses and "415" not in responses:  # SERVER_RULES: a body of another media type
                responses["415"] = {**responses["400"], "description": "The body is not of the media type the "
                                                                       "operation takes (Content-Type)"}
    return merged


def family_for(path: str) -> str:
    """The route family whose error envelope answers `path` (for paths no route serves too)."""
    if path.startswith(("/client/v4/", "/accounts/")):
        return "workers_ai"  # Cloudflare's API space: its envelope, whatever the route
    if path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"):
        return "anthropic"
    for op in OPERATIONS.values():
        if op.path == path:
            return op.family if op.family in ("decisions", "systemone", "anthropic", "cohere") else "openai"
    return "openai"


def openapi_json() -> str:
    return json.dumps(merged_spec())
