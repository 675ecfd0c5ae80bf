"""Tool calls in generated text: a streaming splitter and the per-model call format.

The format comes from the model's tokenizer (mlx-lm infers a parser from the chat template); a model
with none uses the common `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` form, which is
also what the fallback tool instructions ask for.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


@dataclass(frozen=True)
class ToolFormat:
    start: str
    end: str
    parse: Callable[[str, Any], Any]


def _parse_json_call(text: str, tools: Any = None) -> Any:
    return json.loads(text.strip())


DEFAULT_FORMAT = ToolFormat("<tool_call>", "</tool_call>", _parse_json_call)


def tool_format(tokenizer: Any) -> ToolFormat:
    if getattr(tokenizer, "has_tool_calling", False) and tokenizer.tool_parser is not None:
        return ToolFormat(tokenizer.tool_call_start, tokenizer.tool_call_end or "", tokenizer.tool_parser)
    return DEFAULT_FORMAT


def _as_calls(parsed: Any) -> list[ToolCall]:
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError("a tool call needs a name")
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            args = json.loads(args)
        if not isinstance(args, dict):
            raise ValueError("tool call arguments must be an object")
        calls.append(ToolCall(item["name"], json.dumps(args, ensure_ascii=False)))
    return calls


def parse_calls(body: str, fmt: ToolFormat, tools: Any = None) -> list[ToolCall] | None:
    """The calls in one start..end block, or None when it does not parse (then it stays text)."""
    try:
        return _as_calls(fmt.parse(body, tools))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class ToolCallSplitter:
    """Feeds on text deltas; returns text that is safe to show and whole tool calls.

    Text that might be the beginning of a start marker is held back until it is decided.
    """

    def __init__(self, fmt: ToolFormat, tools: Any = None) -> None:
        self.fmt = fmt
        self.tools = tools
        self._buffer = ""
        self._in_call = False
        self._after_call = False  # newlines between consecutive calls are not text

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buffer += text
        out, calls = "", []
        while True:
            if not self._in_call:
                if self._after_call:
                    self._buffer = self._buffer.lstrip("\n")
                    if not self._buffer:
                        return out, calls
                    self._after_call = False
                pos = self._buffer.find(self.fmt.start)
                if pos < 0:
                    keep = _partial_suffix(self._buffer, self.fmt.start)
                    out += self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return out, calls
                out += self._buffer[:pos]
                self._buffer = self._buffer[pos + len(self.fmt.start):]
                self._in_call = True
            else:
                end = self._buffer.find(self.fmt.end) if self.fmt.end else -1
                if end < 0:
                    return out, calls
                body, self._buffer = self._buffer[:end], self._buffer[end + len(self.fmt.end):]
                self._in_call = False
                parsed = parse_calls(body, self.fmt, self.tools)
                if parsed is None:
                    out += self.fmt.start + body + self.fmt.end
                else:
                    calls += parsed
                    self._after_call = True

    def finish(self) -> tuple[str, list[ToolCall]]:
        """End of generation: a pending block is a call if it parses, else it is text."""
        rest, self._buffer = self._buffer, ""
        if self._in_call:
            self._in_call = False
            parsed = parse_calls(rest, self.fmt, self.tools)
            if parsed is not None:
                return "", parsed
            return self.fmt.start + rest, []
        return rest, []


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
