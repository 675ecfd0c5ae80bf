"""Reviewed overlays that narrow an extracted document to what the server accepts.

An overlay lives at `specs/overlays/<document>` (for example `specs/overlays/openai.yaml`) and uses
the action list of the OpenAPI Overlay Specification 1.0:

    overlay: 1.0.0
    info: {title: ..., version: ...}
    actions:
      - target: $.components.schemas.DecisionCreateRequest.properties.model
        update: {minLength: 1}           # objects merge recursively; other values replace
      - target: $.components.schemas.CreateResponse.properties.previous_response_id
        remove: true

Targets are the plain-path subset of JSONPath (`$.a.b`, `$.a['b/c']`, `$.a.allOf[2]`), each naming
exactly one object member. Overlays are applied at extraction, after prose is stripped and components are renamed, so the
pinned documents (and the models generated from them) already say what the server accepts. What no
schema can express stays in the handlers, is described in the overlay's comments, and is listed under
`x-swama-handler-rules` (operation id -> the refusals' messages, as regular expressions); those lists
are copied onto their operations, so the served document states every rule a handler applies.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

_SEGMENT = re.compile(r"\.([A-Za-z0-9_$@-]+)|\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]")


class OverlayError(ValueError):
    pass


def parse_target(target: str) -> list[str | int]:
    if not target.startswith("$"):
        raise OverlayError(f"overlay target must start with '$': {target!r}")
    parts: list[str | int] = []
    pos = 1
    while pos < len(target):
        match = _SEGMENT.match(target, pos)
        if not match:
            raise OverlayError(f"unsupported overlay target {target!r} at {target[pos:]!r}")
        if match.group(3) is not None:
            parts.append(int(match.group(3)))  # an array index, as in allOf[2]
        elif match.group(1) is not None:
            parts.append(match.group(1))
        else:
            parts.append(match.group(2).replace("\\'", "'"))
        pos = match.end()
    if not parts:
        raise OverlayError("an overlay target must name a node below the document root")
    return parts


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _parent(doc: dict[str, Any], parts: list[str | int], create: bool) -> dict[str, Any] | None:
    node: Any = doc
    for part in parts[:-1]:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return None
            node = node[part]
            continue
        if not isinstance(node, dict):
            return None
        if part not in node:
            if not create:
                return None
            node[part] = {}
        node = node[part]
    return node if isinstance(node, dict) and isinstance(parts[-1], str) else None


def apply_overlay(doc: dict[str, Any], overlay: dict[str, Any]) -> list[str]:
    """Apply `overlay` to `doc` in place; returns a note for every action that matched nothing."""
    if not str(overlay.get("overlay", "")).startswith("1."):
        raise OverlayError("an overlay needs `overlay: 1.0.0`")
    notes = []
    for index, action in enumerate(overlay.get("actions") or []):
        target = action.get("target")
        if not isinstance(target, str):
            raise OverlayError(f"overlay action {index} has no target")
        parts = parse_target(target)
        if action.get("remove"):
            parent = _parent(doc, parts, create=False)
            if parent is None or parts[-1] not in parent:
                notes.append(f"action {index}: {target} matched nothing to remove")
                continue
            del parent[parts[-1]]
        elif "update" in action:
            update = action["update"]
            parent = _parent(doc, parts, create=True)
            if parent is None:
                raise OverlayError(f"overlay action {index}: {target} does not lead through objects")
            if isinstance(update, dict) and isinstance(parent.get(parts[-1]), dict):
                _merge(parent[parts[-1]], update)
            else:
                parent[parts[-1]] = copy.deepcopy(update)
        else:
            raise OverlayError(f"overlay action {index} ({target}) needs `update` or `remove: true`")
    notes += _state_handler_rules(doc, overlay.get(HANDLER_RULES) or {})
    return notes


HANDLER_RULES = "x-swama-handler-rules"


def _state_handler_rules(doc: dict[str, Any], rules: dict[str, list[str]]) -> list[str]:
    """Put each operation's handler-only rules on the operation itself."""
    operations = {op.get("operationId"): op for item in doc.get("paths", {}).values() for op in item.values()
                  if isinstance(op, dict)}
    notes = []
    for operation_id, patterns in rules.items():
        if operation_id not in operations:
            notes.append(f"{HANDLER_RULES}: no operation {operation_id}")
            continue
        operations[operation_id][HANDLER_RULES] = list(patterns)
    return notes


def overlay_path(specs_dir: Path, document: str) -> Path:
    return specs_dir / "overlays" / document


def apply_overlay_file(doc: dict[str, Any], path: Path) -> list[str]:
    """Apply the overlay at `path` when it exists (a document may have none)."""
    if not path.exists():
        return []
    return apply_overlay(doc, yaml.safe_load(path.read_text(encoding="utf-8")))
