"""Strict JSON parsing for request bodies.

Compared with ``json.loads`` this keeps object members in their original order (plain dicts),
refuses duplicate keys at any depth (compared after escape decoding, so ``"a"`` and ``"\\u0061"``
collide), refuses ``NaN``/``Infinity``/``-Infinity`` and numbers that overflow to infinity,
refuses lone UTF-16 surrogates and invalid UTF-8, and refuses nesting deeper than ``MAX_DEPTH``.
Each failure carries the rule that failed so every route can word its own message.
"""

from __future__ import annotations

import json
import math
import operator
import re
from enum import Enum
from itertools import accumulate, count
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


_STRING_LITERAL = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# Openers become 2 and closers 0, so the running sum minus the bracket count is the depth.
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _too_deep(body: bytes) -> bool:
    """Whether containers nest deeper than MAX_DEPTH (strings are skipped; C-speed throughout)."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        return False
    brackets = _STRING_LITERAL.sub(b"", body).translate(None, _NOT_BRACKETS)
    steps = brackets.translate(_BRACKET_STEPS)
    return max(map(operator.sub, accumulate(steps), count(1)), default=0) > MAX_DEPTH


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
    if _too_deep(raw):
        raise StrictJSONError(JSONRule.TOO_DEEP)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
    except StrictJSONError:
        raise
    except (ValueError, RecursionError) as exc:
        raise StrictJSONError(JSONRule.INVALID, detail=str(exc)) from None
    # Escaped surrogates are the only way to spell one in valid UTF-8 JSON.
    if b"\\u" in raw and _has_lone_surrogate(value):
        raise StrictJSONError(JSONRule.INVALID, detail="a string holds a lone UTF-16 surrogate")
    return value
