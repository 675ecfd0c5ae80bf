"""multipart/form-data bodies (audio uploads): the fields typed from the generated model's schema, since
a form sends every value as text."""

from __future__ import annotations

import functools
from typing import Any

import pydantic
from fastapi import Request

from swama.handlers.http.errors import ApiError, bad_request
from swama.handlers.http.strict_json import StrictJSONError, parse_strict_json


async def read_form(request: Request, body: bytes, model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """A multipart/form-data body's fields, each typed as the model's field takes it (uploads as bytes)."""
    from starlette.requests import Request as StarletteRequest

    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise ApiError(415, f"This route takes a multipart/form-data body (got {content_type!r}).",
                       code="unsupported_media_type")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await StarletteRequest(request.scope, receive).form(max_files=4, max_fields=64)
    except Exception as exc:  # python-multipart raises several unrelated types
        raise bad_request(f"Malformed request: the multipart body does not parse ({exc})",
                          code="invalid_multipart") from None
    kinds = _form_kinds(model)
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if not isinstance(value, str):
            fields[name] = await value.read()  # an upload: the model's `file` is binary
            request.state.upload_names = {**getattr(request.state, "upload_names", {}), name: value.filename}
            continue
        key = name.removesuffix("[]")
        kind = kinds.get(key, set())
        if "array" in kind:
            fields.setdefault(key, []).append(value)
        else:
            fields[key] = _form_value(value, kind)
    return fields


@functools.cache
def _form_kinds(model: type[pydantic.BaseModel]) -> dict[str, set[str]]:
    """The JSON types each field may take: form fields arrive as text and are typed from these."""

    schema = model.model_json_schema()
    defs = schema.get("$defs", {})

    def types(node: dict[str, Any]) -> set[str]:
        if "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
        found = {node["type"]} if isinstance(node.get("type"), str) else set()
        if "enum" in node or "const" in node:
            found.add("string")
        for key in ("anyOf", "oneOf", "allOf"):
            for member in node.get(key, []):
                found |= types(member)
        return found

    return {name: types(prop) for name, prop in schema["properties"].items()}


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", dict: "object", type(None): "null"}


def _form_value(text: str, kinds: set[str]) -> Any:
    """A form field's text as the JSON value it spells, when the field takes such a value (a number,
    a boolean, null or an object); otherwise the text itself, for the model to judge."""
    if not kinds - {"string"}:
        return text
    try:
        # Strict, as a JSON body is: bounded nesting (a field nested past Python's recursion bound
        # raised RecursionError, a 500), no duplicate keys, no NaN.
        value = parse_strict_json(text)
    except StrictJSONError:
        return text
    kind = _JSON_TYPES.get(type(value))
    if kind in kinds or (kind == "integer" and "number" in kinds):
        return value
    return text
