"""Wording of generated-model validation errors: where in the request, and what was wrong."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic
from pydantic_core import ErrorDetails

from swama.handlers.http.errors import ApiError, bad_request

# Union member names pydantic adds to error locations.
_TAGS = {"str", "bool", "int", "float", "list", "dict", "function-after", "function-before", "nullable"}


def user_path(loc: tuple[Any, ...], data: Any) -> list[str | int]:
    """The error location as the user wrote it: pydantic adds union-member and tag names to it."""
    path: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and (part in _TAGS or "[" in part or part[:1].isupper()
                                        or isinstance(node, list)
                                        or (isinstance(node, dict) and part in _string_values(node))):
            continue  # a union member (a type or generated class name) or a discriminator tag
        else:
            path.append(part)  # a missing or unknown field: nothing to descend into
            break
        path.append(part)
    return path


def _string_values(node: dict[str, Any]) -> set[str]:
    return {v for v in node.values() if isinstance(v, str)}


def dotted(path: list[str | int]) -> str | None:
    return ".".join(str(p) for p in path) or None


def openai_schema_error(exc: pydantic.ValidationError, data: Any = None) -> ApiError:
    """The first problem, worded for the OpenAI routes' envelope (`param` is the dotted path)."""
    first: ErrorDetails = exc.errors(include_url=False)[0]
    param = dotted(user_path(first["loc"], data))
    where = f" at '{param}'" if param else ""
    kind = first["type"]
    if kind == "extra_forbidden":
        return bad_request(f"Unknown field '{param}'.", code="unknown_parameter", param=param)
    if kind == "missing":
        return bad_request(f"Missing required field '{param}'.", code="missing_required_parameter", param=param)
    return bad_request(f"Invalid value{where}: {first['msg']}.", code="invalid_type", param=param)


def worded_or_default(exc: pydantic.ValidationError, data: Any,
                      word: Callable[[ErrorDetails, Any], ApiError | None]) -> ApiError:
    """A route's own wording (`word`) where it has one, refused fields first, else the OpenAI default."""
    worded = [w for w in (word(e, data) for e in exc.errors(include_url=False)) if w is not None]
    refused = [w for w in worded if w.code == "unsupported_parameter"]
    return (refused or worded or [openai_schema_error(exc, data)])[0]
