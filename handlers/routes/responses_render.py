"""`POST /v1/responses` output: Response objects, output items and the typed SSE event sequence.

Everything here is pure. `ResponseStream` turns the generator's events (`TextDelta`,
`ReasoningDelta`, `ToolCallEvent`, `Finished`) into `(event_type, payload)` pairs; `final_response` runs the same
machine and keeps only the terminal Response object, so streaming and non-streaming agree.
Fields the pinned schema requires but marks nullable are always present, as explicit nulls.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from swama.engine.client import (
    Event,
    Finished,
    Logprobs,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCall,
    ToolCallEvent,
)
from swama.handlers.routes.turns import disk_cached, wire_token_logprobs, with_draft_tokens

if TYPE_CHECKING:  # the request module imports this one to answer
    from swama.handlers.routes.responses import ResponseRequest

Frame = tuple[str, dict[str, Any]]

SSE_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive"}
SSE_MEDIA_TYPE = "text/event-stream"


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def sorted_arguments(arguments: str) -> str:
    """A call's arguments as a JSON object string with sorted keys (unchanged if not an object)."""
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError):
        return arguments
    if not isinstance(value, dict):
        return arguments
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# -- items -----------------------------------------------------------------------------------------

def output_text_part(text: str, logprobs: list[TokenLogprob] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": wire_token_logprobs(logprobs or [])}


def message_item(item_id: str, text: str, status: str = "completed",
                 logprobs: list[TokenLogprob] | None = None) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [output_text_part(text, logprobs)]}


def message_stub(item_id: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}


def summary_part(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A model's thinking: the whole text as its summary (a local model's thinking is not hidden)."""
    return {"id": item_id, "type": "reasoning", "summary": [summary_part(text)] if text else [], "status": status}


def function_call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call.id or item_id, "name": call.name,
            "arguments": sorted_arguments(call.arguments), "status": status}


def function_call_stub(item_id: str, call: ToolCall) -> dict[str, Any]:
    return {**function_call_item(item_id, call, "in_progress"), "arguments": ""}


def usage_payload(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                  draft_tokens: int = 0, reasoning_tokens: int = 0, disk_tokens: int = 0) -> dict[str, Any]:
    # cached_tokens: prompt tokens resumed from the prompt cache (disk_tokens of them from its disk
    # tier); reasoning_tokens: the thinking's.
    return with_draft_tokens({"input_tokens": prompt_tokens, "output_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens,
                              "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0,
                                                       **disk_cached(disk_tokens)},
                              "output_tokens_details": {"reasoning_tokens": reasoning_tokens}}, draft_tokens)


def response_object(req: ResponseRequest, *, id: str, created_at: int, status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None, error: dict[str, Any] | None = None,
                    incomplete_reason: str | None = None) -> dict[str, Any]:
    """A Response object; every echoed value comes from the parsed request."""
    return {
        "id": id, "object": "response", "created_at": created_at, "model": req.model, "status": status,
        "output": output, "parallel_tool_calls": req.parallel_tool_calls, "tool_choice": req.tool_choice,
        "tools": req.tools, "temperature": float(req.temperature), "top_p": float(req.top_p),
        "max_output_tokens": req.max_output_tokens, "instructions": req.instructions,
        "previous_response_id": None, "truncation": "disabled", "store": False, "background": False,
        "metadata": {}, "text": {"format": req.text_format}, "top_logprobs": req.top_logprobs, "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "usage": usage, "user": None,
    }


def sse_frame(event_type: str, payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event_type}\ndata: {data}\n\n".encode()


# -- the event machine -----------------------------------------------------------------------------

@dataclass
class _Slot:
    """One output item: its id, its output_index (allocation order) and, for calls, the call."""

    item_id: str
    index: int
    call: ToolCall | None = None
    reasoning: str | None = None  # a reasoning item's whole text, once it is closed


class ResponseStream:
    """Turns generator events into the typed Responses event sequence.

    Call `start()` once, `feed(event)` for each generator event in order, or `failed(message)` when
    generation breaks. Every method returns the frames to send; `sequence_number` counts from 0 over
    all of them. After `Finished`, `response` holds the terminal Response object.
    """

    def __init__(self, req: ResponseRequest, *, response_id: str | None = None,
                 created_at: int | None = None) -> None:
        self.req = req
        self.id = response_id or new_response_id()
        self.created_at = int(time.time()) if created_at is None else created_at
        self.response: dict[str, Any] | None = None
        self._sequence = 0
        self._slots: list[_Slot] = []
        self._text_slot: _Slot | None = None
        self._text: list[str] = []
        self._thinking_slot: _Slot | None = None  # the reasoning item still receiving text
        self._thought: list[str] = []
        self._logprobs: list[TokenLogprob] = []  # every text token's, in order
        self._pending = 0  # how many of them wait for the text delta they belong to
        self._terminated = False

    @property
    def finished(self) -> bool:
        return self._terminated

    def _frame(self, event_type: str, **fields: Any) -> Frame:
        payload = {"type": event_type, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event_type, payload

    def _object(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                **extra: Any) -> dict[str, Any]:
        return response_object(self.req, id=self.id, created_at=self.created_at, status=status, output=output,
                               usage=usage, **extra)

    def _allocate(self, prefix: str, call: ToolCall | None = None) -> _Slot:
        slot = _Slot(new_item_id(prefix), len(self._slots), call)
        self._slots.append(slot)
        return slot

    def start(self) -> list[Frame]:
        return [self._frame("response.created", response=self._object("in_progress", [], None)),
                self._frame("response.in_progress", response=self._object("in_progress", [], None))]

    def feed(self, event: Event) -> list[Frame]:
        if self._terminated:
            return []
        if isinstance(event, Logprobs):
            self._logprobs += event.entries
            self._pending += len(event.entries)
            return []
        if isinstance(event, ReasoningDelta):
            return self._reasoning_delta(event.text)
        if isinstance(event, TextDelta):
            return self._close_reasoning() + self._text_delta(event.text)
        if isinstance(event, ToolCallEvent):
            return self._close_reasoning() + self._tool_call(event.call)
        if isinstance(event, Finished):
            return self._close_reasoning() + self._finish(event)
        raise TypeError(f"not a generator event: {event!r}")

    def failed(self, message: str) -> list[Frame]:
        """The terminal `response.failed` for an error after the stream began (once; later calls send nothing)."""
        if self._terminated:
            return []
        self._terminated = True
        self.response = self._object("failed", [], None, error={"code": "server_error", "message": message})
        return [self._frame("response.failed", response=self.response)]

    def run(self, events: Iterable[Event]) -> Iterator[Frame]:
        """The whole sequence for events that are already at hand."""
        yield from self.start()
        for event in events:
            yield from self.feed(event)

    def _reasoning_delta(self, text: str) -> list[Frame]:
        frames = []
        if self._thinking_slot is None:
            slot = self._thinking_slot = self._allocate("rs")
            self._thought = []
            frames += [
                self._frame("response.output_item.added", output_index=slot.index,
                            item=reasoning_item(slot.item_id, "", "in_progress")),
                self._frame("response.reasoning_summary_part.added", item_id=slot.item_id, output_index=slot.index,
                            summary_index=0, part=summary_part("")),
            ]
        self._thought.append(text)
        slot = self._thinking_slot
        frames.append(self._frame("response.reasoning_summary_text.delta", item_id=slot.item_id,
                                  output_index=slot.index, summary_index=0, delta=text))
        return frames

    def _close_reasoning(self) -> list[Frame]:
        """The reasoning item's closing events, once something other than thinking arrives."""
        slot, self._thinking_slot = self._thinking_slot, None
        if slot is None:
            return []
        slot.reasoning = text = "".join(self._thought)
        return [
            self._frame("response.reasoning_summary_text.done", item_id=slot.item_id, output_index=slot.index,
                        summary_index=0, text=text),
            self._frame("response.reasoning_summary_part.done", item_id=slot.item_id, output_index=slot.index,
                        summary_index=0, part=summary_part(text)),
            self._frame("response.output_item.done", output_index=slot.index, item=reasoning_item(slot.item_id, text)),
        ]

    def _text_delta(self, text: str) -> list[Frame]:
        frames = []
        if self._text_slot is None:
            slot = self._text_slot = self._allocate("msg")
            frames += [
                self._frame("response.output_item.added", output_index=slot.index, item=message_stub(slot.item_id)),
                self._frame("response.content_part.added", item_id=slot.item_id, output_index=slot.index,
                            content_index=0, part=output_text_part("")),
            ]
        self._text.append(text)
        slot = self._text_slot
        fresh = self._logprobs[len(self._logprobs) - self._pending:] if self._pending else []
        self._pending = 0
        frames.append(self._frame("response.output_text.delta", item_id=slot.item_id, output_index=slot.index,
                                  content_index=0, logprobs=wire_token_logprobs(fresh), delta=text))
        return frames

    def _tool_call(self, call: ToolCall) -> list[Frame]:
        slot = self._allocate("fc", call)
        arguments = sorted_arguments(call.arguments)
        return [
            self._frame("response.output_item.added", output_index=slot.index,
                        item=function_call_stub(slot.item_id, call)),
            self._frame("response.function_call_arguments.delta", item_id=slot.item_id, output_index=slot.index,
                        delta=arguments),
            self._frame("response.function_call_arguments.done", item_id=slot.item_id, output_index=slot.index,
                        name=call.name, arguments=arguments),
            self._frame("response.output_item.done", output_index=slot.index,
                        item=function_call_item(slot.item_id, call)),
        ]

    def _item(self, slot: _Slot, text_status: str) -> dict[str, Any]:
        if slot.call is not None:
            return function_call_item(slot.item_id, slot.call)
        if slot.reasoning is not None:
            return reasoning_item(slot.item_id, slot.reasoning)
        return message_item(slot.item_id, "".join(self._text), text_status, self._logprobs)

    def _finish(self, done: Finished) -> list[Frame]:
        incomplete = done.finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        frames = []
        slot = self._text_slot
        if slot is not None:
            text = "".join(self._text)
            frames += [
                self._frame("response.output_text.done", item_id=slot.item_id, output_index=slot.index,
                            content_index=0, logprobs=wire_token_logprobs(self._logprobs), text=text),
                self._frame("response.content_part.done", item_id=slot.item_id, output_index=slot.index,
                            content_index=0, part=output_text_part(text, self._logprobs)),
                self._frame("response.output_item.done", output_index=slot.index,
                            item=message_item(slot.item_id, text, status, self._logprobs)),
            ]
        self._terminated = True
        self.response = self._object(status, [self._item(s, status) for s in self._slots],
                                     usage_payload(done.prompt_tokens, done.completion_tokens, done.cached_tokens,
                                                   done.draft_tokens, done.reasoning_tokens, done.disk_cached_tokens),
                                     incomplete_reason="max_output_tokens" if incomplete else None)
        frames.append(self._frame(f"response.{status}", response=self.response))
        return frames


def final_response(req: ResponseRequest, events: Iterable[Event], *, response_id: str | None = None,
                   created_at: int | None = None) -> dict[str, Any]:
    """The non-streaming Response object, assembled by the same machine as the stream."""
    stream = ResponseStream(req, response_id=response_id, created_at=created_at)
    for _ in stream.run(events):
        pass
    if stream.response is None:
        raise ValueError("the generator ended without a Finished event")
    return stream.response
