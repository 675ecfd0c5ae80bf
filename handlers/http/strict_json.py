"""Strict JSON parsing for request bodies.

Compared with ``json.loads`` this keeps object members in their original order (plain dicts),
refuses duplicate keys at any depth (compared after escape decoding, so ``"a"`` and ``"\\u0061"``
collide), refuses ``NaN``/``Infinity``/``-Infinity`` and numbers that overflow to infinity,
refuses lone UTF-16 surrogates and invalid UTF-8, and refuses nesting deeper than ``MAX_DEPTH``.
Every step runs in time linear in the body (C's JSON scanner, then one walk over the containers).
Each failure carries the rule that failed so every route can word its own message.
"""

from __future__ import annotations

import json
import math
import re
from enum import Enum
from typing import Any

MAX_DEPTH = 256

JSONValue = Any  # dict[str, JSONValue] | list[JSONValue] | str | int | float | bool | None


class JSONRule(Enum):
    INVALID = "invalid"
    DUPLICATE_KEY = "duplicate_key"
    TOO_DEEP = "too_deep"


class StrictJSONError(ValueError):
    """A body that strict parsing refuses; ``key`` names the repeated key for DUPLICATE_KEY."""

    def __init__(self, rule: JSONRule, key: str | None = None, detail: str | None = None) -> None:
        self.rule = rule
        self.key = key
        self.detail = detail  # what was wrong, for routes that say it
        super().__init__(detail or (rule.value if key is None else f"{rule.value}: {key!r}"))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _too_deep(value: Any) -> bool:
    """Whether the parsed containers nest deeper than MAX_DEPTH: one walk over the containers, after
    `json.loads` has read the body in linear time (its own recursion bound ends far deeper bodies)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        members = item.values() if isinstance(item, dict) else item
        stack.extend((m, depth + 1) for m in members if isinstance(m, dict | list))
    return False


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise StrictJSONError(JSONRule.DUPLICATE_KEY, key)
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise StrictJSONError(JSONRule.INVALID, detail=f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError(JSONRule.INVALID, detail=f"{text} overflows a JSON number")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            for key, member in item.items():
                if _SURROGATE.search(key):
                    return True
                stack.append(member)
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_strict_json(body: bytes | str) -> JSONValue:
    """Parse one JSON document strictly, or raise ``StrictJSONError``."""
    if isinstance(body, str):
        try:
            raw = body.encode("utf-8")
        except UnicodeEncodeError:
            raise StrictJSONError(JSONRule.INVALID) from None
    else:
        raw = bytes(body)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJSONError(JSONRule.INVALID, detail=f"the body is not UTF-8 ({exc.reason})") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
    except StrictJSONError:
        raise
    except RecursionError:  # nested past the interpreter's own bound, far past MAX_DEPTH
        raise StrictJSONError(JSONRule.TOO_DEEP) from None
    except ValueError as exc:
        raise StrictJSONError(JSONRule.INVALID, detail=str(exc)) from None
    # Fewer brackets than the limit cannot nest past it (counted at C speed); else walk the containers.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and isinstance(value, dict | list) and _too_deep(value):
        raise StrictJSONError(JSONRule.TOO_DEEP)
    # Escaped surrogates are the only way to spell one in valid UTF-8 JSON.
    if b"\\u" in raw and _has_lone_surrogate(value):
        raise StrictJSONError(JSONRule.INVALID, detail="a string holds a lone UTF-16 surrogate")
    return value
