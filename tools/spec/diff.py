"""A readable diff of what a spec bump changes: operations, schemas, fields, types, requiredness."""

from __future__ import annotations

import json
from typing import Any


def type_of(schema: Any) -> str:
    """A short type signature of a schema, enough to tell a retyped field."""
    if not isinstance(schema, dict):
        return "any"
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    for key in ("oneOf", "anyOf", "allOf"):
        if key in schema:
            sep = " & " if key == "allOf" else " | "
            return sep.join(type_of(s) for s in schema[key])
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return "enum[" + ",".join(json.dumps(v) for v in schema["enum"]) + "]"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " | ".join(kind)
    if kind == "array":
        return f"array[{type_of(schema.get('items', {}))}]"
    if schema.get("nullable"):
        kind += " | null"
    return kind


def _props(schema: Any) -> tuple[dict[str, Any], set[str]]:
    props: dict[str, Any] = {}
    required: set[str] = set()
    if isinstance(schema, dict):
        props.update(schema.get("properties", {}))
        required |= set(schema.get("required", []))
        for part in schema.get("allOf", []):
            if "$ref" not in part:
                p, r = _props(part)
                props.update(p)
                required |= r
    return props, required


def _operations(doc: dict[str, Any]) -> set[str]:
    return {f"{m.upper()} {p}" for p, item in doc.get("paths", {}).items() for m in item}


def diff_documents(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for op in sorted(_operations(new) - _operations(old)):
        lines.append(f"+ operation {op}")
    for op in sorted(_operations(old) - _operations(new)):
        lines.append(f"- operation {op}")
    old_s = old.get("components", {}).get("schemas", {})
    new_s = new.get("components", {}).get("schemas", {})
    for name in sorted(set(new_s) - set(old_s)):
        lines.append(f"+ schema {name}")
    for name in sorted(set(old_s) - set(new_s)):
        lines.append(f"- schema {name}")
    for name in sorted(set(old_s) & set(new_s)):
        if old_s[name] == new_s[name]:
            continue
        (op, oreq), (np_, nreq) = _props(old_s[name]), _props(new_s[name])
        changes = []
        for field in sorted(set(np_) - set(op)):
            changes.append(f"+ {field}: {type_of(np_[field])}" + (" (required)" if field in nreq else ""))
        for field in sorted(set(op) - set(np_)):
            changes.append(f"- {field}: {type_of(op[field])}")
        for field in sorted(set(op) & set(np_)):
            before, after = type_of(op[field]), type_of(np_[field])
            if before != after:
                changes.append(f"~ {field}: {before} -> {after}")
            elif op[field] != np_[field]:
                changes.append(f"~ {field}: constraints changed")
            if (field in oreq) != (field in nreq):
                changes.append(f"~ {field}: {'now required' if field in nreq else 'now optional'}")
        if not changes and type_of(old_s[name]) != type_of(new_s[name]):
            changes.append(f"~ {type_of(old_s[name])} -> {type_of(new_s[name])}")
        if not changes:
            changes.append("~ constraints changed")
        lines.append(f"~ schema {name}")
        lines += [f"    {c}" for c in changes]
    return lines
