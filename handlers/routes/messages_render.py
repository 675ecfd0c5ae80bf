"""POST /v1/messages: the Message object and Anthropic's stream of events.

`MessageStream` turns the generator's events into Anthropic's event sequence (`message_start`,
`ping`, then per content block `content_block_start`, its deltas and `content_block_stop`, then
`message_delta` with the stop reason and usage, and `message_stop`); `final_message` runs the same
machine and keeps the Message it ends with, so streaming and non-streaming agree.

The thinking of a model that thinks is a `thinking` block. Its `signature` is a digest of the text:
there is nothing to verify locally, and clients that send thinking back only need a string.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable
from typing import Any

from swama.engine.client import Event, Finished, ReasoningDelta, TextDelta, ToolCallEvent

Frame = tuple[str, dict[str, Any]]

# Finished.finish_reason -> stop_reason; a stop sequence's own reason is set from Finished.stop_sequence.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def signature(thinking: str) -> str:
    return hashlib.sha256(thinking.encode()).hexdigest()


def usage(done: Finished | None) -> dict[str, Any]:
    """Anthropic's usage: prompt tokens resumed from the prompt cache are cache reads, the rest input."""
    if done is None:
        return {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0}
    read = {"disk_cache_read_input_tokens": done.disk_cached_tokens} if done.disk_cached_tokens else {}
    return {"input_tokens": done.prompt_tokens - done.cached_tokens, "output_tokens": done.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": done.cached_tokens, **read}


def stop_of(done: Finished) -> tuple[str, str | None]:
    if done.stop_sequence is not None and done.finish_reason == "stop":
        return "stop_sequence", done.stop_sequence
    return STOP_REASONS.get(done.finish_reason, "end_turn"), None


def sse_frame(event_type: str, payload: dict[str, Any]) -> bytes:
    return f"event: {event_type}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


class MessageStream:
    """Anthropic's events for one generation; `message` is the whole Message once it finished."""

    def __init__(self, model: str, message_id: str | None = None) -> None:
        self.model = model
        self.id = message_id or new_message_id()
        self.blocks: list[dict[str, Any]] = []  # the Message's content, as it grows
        self.open: str | None = None  # the type of the block receiving deltas
        self.message: dict[str, Any] | None = None

    def _shell(self, content: list[dict[str, Any]], done: Finished | None) -> dict[str, Any]:
        reason, sequence = stop_of(done) if done is not None else (None, None)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": reason, "stop_sequence": sequence, "usage": usage(done)}

    def start(self) -> list[Frame]:
        return [("message_start", {"type": "message_start", "message": self._shell([], None)}),
                ("ping", {"type": "ping"})]

    def _index(self) -> int:
        return len(self.blocks) - 1

    def _close(self) -> list[Frame]:
        if self.open is None:
            return []
        frames: list[Frame] = []
        block = self.blocks[-1]
        if self.open == "thinking":
            block["signature"] = signature(block["thinking"])
            frames.append(("content_block_delta", {"type": "content_block_delta", "index": self._index(),
                                                   "delta": {"type": "signature_delta",
                                                             "signature": block["signature"]}}))
        self.open = None
        return frames + [("content_block_stop", {"type": "content_block_stop", "index": self._index()})]

    def _begin(self, kind: str, block: dict[str, Any]) -> list[Frame]:
        frames = self._close()
        self.blocks.append(block)
        self.open = kind
        start = {**block, **({"signature": ""} if kind == "thinking" else {})}
        return frames + [("content_block_start", {"type": "content_block_start", "index": self._index(),
                                                  "content_block": start})]

    def _delta(self, kind: str, field: str, delta_type: str, text: str) -> list[Frame]:
        frames: list[Frame] = []
        if self.open != kind:
            frames += self._begin(kind, {"type": kind, field: ""})
        self.blocks[-1][field] += text
        return frames + [("content_block_delta", {"type": "content_block_delta", "index": self._index(),
                                                  "delta": {"type": delta_type, field: text}})]

    def feed(self, event: Event) -> list[Frame]:
        if isinstance(event, ReasoningDelta):
            return self._delta("thinking", "thinking", "thinking_delta", event.text)
        if isinstance(event, TextDelta):
            return self._delta("text", "text", "text_delta", event.text)
        if isinstance(event, ToolCallEvent):
            call = event.call
            frames = self._begin("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            self.blocks[-1]["input"] = json.loads(call.arguments)
            frames.append(("content_block_delta", {"type": "content_block_delta", "index": self._index(),
                                                   "delta": {"type": "input_json_delta",
                                                             "partial_json": call.arguments}}))
            return frames + self._close()
        if isinstance(event, Finished):
            frames = self._close()
            self.message = self._shell(self.blocks, event)
            reason, sequence = stop_of(event)
            return frames + [
                ("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                   "usage": usage(event)}),
                ("message_stop", {"type": "message_stop"}),
            ]
        return []  # log probabilities: the Messages API has none

    @staticmethod
    def failed(error_type: str, message: str) -> list[Frame]:
        """An error after the stream began: Anthropic's `error` event."""
        return [("error", {"type": "error", "error": {"type": error_type, "message": message}})]


def final_message(model: str, events: Iterable[Event]) -> dict[str, Any]:
    stream = MessageStream(model)
    stream.start()
    for event in events:
        stream.feed(event)
    if stream.message is None:
        raise ValueError("the generator ended without a Finished event")
    return stream.message
