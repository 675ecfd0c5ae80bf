"""The affinity key of a request: which requests should land on the same replica.

A replica keeps the prompt cache of the conversations it served, so a conversation's next turn is
cheapest where its earlier turns ran. A chat or responses request is keyed by its model, its tools
and its turns up to the first user message: every later turn of the conversation repeats those, so
turn two maps to the key of turn one. A decision request (/v1/decisions, System One, Clef) is keyed
by its model and its input, so requests that share an input share the replica that has scored it.
Anything else has no key and goes to the least-loaded replica.

Pure functions of the path and the body: no Ray here, so the rule is tested on its own.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

# Decision routes read their input from these fields; the path picks which.
_DECISION_INPUT = {"/v1/decisions": "input", "/v1/systemone": "state"}
_WORKERS_AI_RUN = re.compile(r"(?:/client/v4)?/accounts/[^/]+/ai/run/(.+)")


def _text(content: Any) -> Any:
    """A message's content with its parts' text joined, so `"hi"` and `[{"type": "input_text", "text":
    "hi"}]` key alike; parts without text (images) are kept whole."""
    if isinstance(content, list):
        parts = [part.get("text") if isinstance(part, dict) and isinstance(part.get("text"), str) else part
                 for part in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
        return parts
    return content


def _opening(turns: list[Any]) -> list[Any] | None:
    """The turns up to and including the first user message (role and content), or None without one."""
    opening = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        role = turn.get("role", "user")  # responses input items may leave the role out
        opening.append([role, _text(turn.get("content"))])
        if role == "user":
            return opening
    return None


def _conversation(path: str, data: dict[str, Any]) -> list[Any] | None:
    if path == "/v1/chat/completions":
        messages = data.get("messages")
        return _opening(messages) if isinstance(messages, list) else None
    if path == "/v1/responses":
        given = data.get("input")
        turns = [{"role": "user", "content": given}] if isinstance(given, str) else given
        if not isinstance(turns, list):
            return None
        opening = _opening(turns)
        return [data.get("instructions"), *opening] if opening is not None else None
    return None


def affinity_key(path: str, body: bytes) -> str:
    """The request's affinity key ("" when it has none): a short digest, never the text itself."""
    if not body:
        return ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # the replica's own pipeline words the 400
        return ""
    if not isinstance(data, dict):
        return ""
    model = data.get("model")
    if path in _DECISION_INPUT:
        basis: Any = ["decide", model, data.get(_DECISION_INPUT[path]), data.get("images")]
    elif run := _WORKERS_AI_RUN.fullmatch(path):
        basis = ["decide", run.group(1), data.get("state"), data.get("images")]
    elif (opening := _conversation(path, data)) is not None:
        basis = ["chat", model, data.get("tools"), opening]
    else:
        return ""
    encoded = json.dumps(basis, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.blake2b(encoded.encode(), digest_size=16).hexdigest()
