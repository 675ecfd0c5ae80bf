"""The one conversion both chat completions and responses share: turns, tools and sampling values
become the generator's `ChatRequest`. Each route reads its own typed request into these pieces and
keeps its own wording for what it refuses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from swama.engine.client import ChatRequest, EngineClient, InstalledModel, Sampling, Task
from swama.handlers.media.images import ImageRef, load_images, open_images

EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass
class Turn:
    """One chat message; text parts stay separate until the message is built. An image part
    (an `ImageRef`) makes the content a list of parts, in order, for the chat template."""

    role: str
    parts: list[str | ImageRef] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str | None = None

    def content(self) -> str | list[dict[str, Any]]:
        if not any(isinstance(p, ImageRef) for p in self.parts):
            return "\n".join(self.parts)  # type: ignore[arg-type]
        return [{"type": "image"} if isinstance(p, ImageRef) else {"type": "text", "text": p} for p in self.parts]

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role, "content": self.content()}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        return msg


def tool_call(call_id: str | None, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def json_object(text: Any) -> dict[str, Any] | None:
    """`text` parsed as a JSON object, or None: tool-call arguments are never forged into `{}`."""
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A function tool in the chat-template form the generator takes."""
    return {"type": "function", "function": {"name": name, "description": description or "",
                                             "parameters": parameters or EMPTY_SCHEMA}}


def merge_adjacent_system(turns: list[Turn]) -> list[Turn]:
    """Chat templates fail on two system turns in a row (responses' `instructions` plus `developer`
    items always produce them); their parts are concatenated in order instead."""
    merged: list[Turn] = []
    for turn in turns:
        prev = merged[-1] if merged else None
        if (prev is not None and prev.role == turn.role == "system"
                and not prev.tool_calls and not turn.tool_calls):
            merged[-1] = Turn("system", prev.parts + turn.parts)
        else:
            merged.append(turn)
    return merged


def sampling(**values: Any) -> Sampling:
    """Sampling options from a request; an option the request leaves out keeps the engine default."""
    return Sampling(**{name: value for name, value in values.items() if value is not None})


def image_refs(turns: list[Turn]) -> list[ImageRef]:
    """The image parts of every turn, in order."""
    return [p for t in turns for p in t.parts if isinstance(p, ImageRef)]


def chat_request(turns: list[Turn], *, sampling: Sampling, context_limit: int,
                 tools: list[dict[str, Any]] | None = None, tool_choice: str | None = None,
                 max_tokens: int | None = None, stop: list[str] | None = None) -> ChatRequest:
    """`tool_choice` "none" is enforced by never offering the tools to the model. Image parts stay
    placeholders: the route loads them (`attach_images`) once it knows the model takes images."""
    offered = None if tool_choice == "none" else (tools or None)
    return ChatRequest(messages=[t.message() for t in merge_adjacent_system(turns)], sampling=sampling,
                       max_tokens=max_tokens, stop=list(stop or []), tools=offered, context_limit=context_limit)


async def attach_images(engine: EngineClient, request: ChatRequest, refs: list[ImageRef],
                        model: InstalledModel) -> None:
    """Load a request's images for `model`: refused on a text-only model before any is fetched,
    fetched or decoded and checked otherwise, then opened for the vision processor."""
    if not refs:
        return
    engine.require(model, Task.READ_IMAGES)
    request.images = open_images(await load_images(refs, remote_allowed=True))
