"""The one conversion both chat completions and responses share: turns, tools and sampling values
become the generator's `ChatRequest`. Each route reads its own typed request into these pieces and
keeps its own wording for what it refuses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pydantic

from swama.engine.client import (
    ChatRequest,
    Constraint,
    EngineClient,
    InstalledModel,
    Sampling,
    Task,
    TokenLogprob,
    ToolSpec,
    TopLogprob,
    effort,
)
from swama.handlers.http.errors import bad_request
from swama.handlers.media.images import ImageRef, load_images, open_images

EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def unwrap(node: Any) -> Any:
    """A generated RootModel's value (the generator wraps unions and `X | null` fields in one)."""
    while isinstance(node, pydantic.RootModel):
        node = node.root
    return node


@dataclass
class Turn:
    """One chat message; text parts stay separate until the message is built. An image part
    (an `ImageRef`) makes the content a list of parts, in order, for the chat template."""

    role: str
    parts: list[str | ImageRef] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str | None = None
    reasoning: str | None = None  # an assistant turn's thinking, for templates that show it again

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
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        return msg


def _alternative(entry: TopLogprob) -> dict[str, Any]:
    return {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.bytes)}


def wire_token_logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Tokens' log probabilities as both routes send them: each with its most probable alternatives."""
    return [{**_alternative(e), "top_logprobs": [_alternative(t) for t in e.top]} for e in entries]


# swama's usage extension (chat, completions, responses): generated tokens that speculative decoding
# drafted and the model accepted. Sent only when there are some, so a usage object without drafting
# stays exactly OpenAI's.
DRAFT_TOKENS = "accepted_draft_tokens"


def disk_cached(tokens: int) -> dict[str, int]:
    """Of the cached prompt tokens, those read back from the prompt cache's disk tier: present only when
    there are some, so a usage without them is OpenAI's own."""
    return {"disk_cached_tokens": tokens} if tokens else {}


def with_draft_tokens(usage: dict[str, Any], draft_tokens: int) -> dict[str, Any]:
    """`usage` with the accepted draft tokens added when there are any."""
    return {**usage, DRAFT_TOKENS: draft_tokens} if draft_tokens > 0 else usage


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


@dataclass(frozen=True)
class OutputRules:
    """What a request asks of the output's form, as both routes read it from their own fields."""

    format: str = "text"  # text | json_object | json_schema
    schema: dict[str, Any] | None = None
    tool_choice: str = "auto"  # none | auto | required | function (a named one)
    function: str | None = None  # the function a named tool_choice forces
    strict: frozenset[str] = frozenset()  # functions whose arguments are held to their parameters
    parallel: bool = True
    logprobs: int | None = None  # top alternatives per token, or None for no log probabilities

    def constraint(self, tools: list[dict[str, Any]], where: str | None,
                   choice_param: str | None) -> Constraint | None:
        """The engine's constraint; 400 where the request's fields contradict each other."""
        names = [t["function"]["name"] for t in tools]
        if self.format != "text":
            if tools and self.tool_choice != "none":
                raise bad_request("A JSON response format and tools cannot both hold: send tools with "
                                  "tool_choice \"none\", or no tools.", param=where)
            if self.format == "json_object":
                return Constraint("json_object")
            return Constraint("json_schema", json.dumps(self.schema or {}))
        if self.tool_choice in ("required", "function") and not tools:
            raise bad_request(f"tool_choice '{self.tool_choice}' needs at least one function in tools.",
                              param=choice_param)
        if self.tool_choice == "function" and self.function not in names:
            raise bad_request(f"tool_choice names function '{self.function}', which is not among the request's "
                              "tools.", param=choice_param)
        specs = tuple(ToolSpec(t["function"]["name"], json.dumps(t["function"]["parameters"]),
                               t["function"]["name"] in self.strict) for t in tools)
        if self.tool_choice == "function":
            return Constraint("tool_calls", tools=tuple(s for s in specs if s.name == self.function),
                              parallel=self.parallel)
        if self.tool_choice == "required":
            return Constraint("tool_calls", tools=specs, parallel=self.parallel)
        if self.tool_choice == "auto" and any(s.strict for s in specs):
            return Constraint("tool_arguments", tools=specs, parallel=self.parallel)
        return None


@dataclass(frozen=True)
class Thinking:
    """How a request asks a model that thinks to think: the template's switch (None: its default)
    and a budget of thinking tokens (None: up to max_tokens). Models that do not think ignore it."""

    switch: bool | None = None
    budget: int | None = None

    @classmethod
    def from_effort(cls, name: str | None, switch: bool | None = None) -> Thinking:
        """An effort name (engine EFFORT_BUDGETS): none/minimal turn thinking off; the others bound it
        and leave the switch to the template (which thinks, for a model that does), so a request held
        to a grammar still simply does not think. An explicit switch wins over the effort's."""
        on, budget = effort(name)
        on = switch if switch is not None else (False if on is False else None)
        return cls(on, budget if on is not False else None)


def chat_request(turns: list[Turn], *, sampling: Sampling, context_limit: int,
                 tools: list[dict[str, Any]] | None = None, rules: OutputRules | None = None,
                 params: tuple[str | None, str | None] = ("response_format", "tool_choice"),
                 max_tokens: int | None = None, stop: list[str] | None = None,
                 thinking: Thinking = Thinking(), continue_final: bool = False, keep: bool = False) -> ChatRequest:
    """`tool_choice` "none" is enforced by never offering the tools to the model; the other rules
    become the engine's constraint (`params`: the fields its refusals name). Image parts stay placeholders: the route loads them
    (`attach_images`) once it knows the model takes images."""
    rules = rules or OutputRules()
    offered = None if rules.tool_choice == "none" else (tools or None)
    return ChatRequest(messages=[t.message() for t in merge_adjacent_system(turns)], sampling=sampling,
                       max_tokens=max_tokens, stop=list(stop or []), tools=offered, context_limit=context_limit,
                       constraint=rules.constraint(offered or [], *params), logprobs=rules.logprobs,
                       parallel_tool_calls=rules.parallel, thinking=thinking.switch,
                       thinking_budget=thinking.budget, continue_final=continue_final, keep_prompt=keep)


async def attach_images(engine: EngineClient, request: ChatRequest, refs: list[ImageRef],
                        model: InstalledModel, *, private_allowed: bool) -> None:
    """Load a request's images for `model`: refused on a text-only model before any is fetched,
    fetched (from private addresses only when `private_allowed`) or decoded and checked otherwise,
    then opened for the vision processor."""
    if not refs:
        return
    engine.require(model, Task.READ_IMAGES)
    request.images = await open_images(await load_images(refs, remote_allowed=True, private_allowed=private_allowed))
