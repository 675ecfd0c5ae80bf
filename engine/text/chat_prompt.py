"""Chat messages (and tools) to prompt token ids, through the model's own chat template.

Also the context limit: messages are trimmed oldest-first to fit, protecting system and tool
messages and the last user message; a prompt that still does not fit is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from swama.engine.errors import BadInput, ContextTooLong

TOOL_INSTRUCTIONS = (
    "You can call these tools:\n{tools}\n\n"
    "To call a tool, answer with exactly one line per call in this form and nothing else:\n"
    '<tool_call>{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}</tool_call>'
)


@dataclass
class Prompt:
    ids: list[int]
    text: str
    trimmed: bool = False
    opens_thinking: bool = False  # the text ends inside a think block (text/reasoning.py)


class TemplateOptions:
    """The tokenizer, with options added to every `apply_chat_template` call (a request's thinking
    switch, /tokenize's template arguments): build_prompt renders as it always does, with these on top."""

    def __init__(self, tokenizer: Any, options: dict[str, Any]) -> None:
        self._tokenizer = tokenizer
        self._options = options

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        return self._tokenizer.apply_chat_template(messages, **{**kwargs, **self._options})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": False}
    if tools:
        kwargs["tools"] = tools
    try:
        return tokenizer.apply_chat_template(messages, **kwargs)
    except Exception as exc:  # jinja raises its own types; the message is what the user needs
        raise BadInput(f"The model's chat template refused these messages: {exc}") from None


def template_renders_tools(tokenizer: Any) -> bool:
    probe = [{"role": "user", "content": "x"}]
    tool = [{"type": "function", "function": {"name": "swama_probe_tool", "description": "",
                                              "parameters": {"type": "object", "properties": {}}}}]
    try:
        return "swama_probe_tool" in _render(tokenizer, probe, tool)
    except BadInput:
        return False


def with_tool_instructions(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For templates that ignore `tools`: describe them in the system message instead."""
    described = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    note = TOOL_INSTRUCTIONS.format(tools=described)
    messages = [dict(m) for m in messages]
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{note}"
    else:
        messages.insert(0, {"role": "system", "content": note})
    return messages


def _fallback_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls and tool results as plain text, for templates that know no tools."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = "\n".join(
                "<tool_call>" + json.dumps({"name": c["function"]["name"],
                                            "arguments": c["function"]["arguments"]}) + "</tool_call>"
                for c in m.pop("tool_calls"))
            m["content"] = ((m.get("content") or "") + "\n" + calls).strip()
        if m["role"] == "tool":
            m = {"role": "user", "content": f"Tool result ({m.get('tool_call_id', '')}): {m['content']}"}
        out.append(m)
    return out


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def build_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 limit: int, native_tools: bool) -> Prompt:
    if tools and not native_tools:
        messages = with_tool_instructions(_fallback_history(messages), tools)
        tools = None
    elif not native_tools:
        messages = _fallback_history(messages)
    text = _render(tokenizer, messages, tools)
    ids = encode(tokenizer, text)
    if len(ids) < limit:
        return Prompt(ids, text)
    return _trim(tokenizer, messages, tools, limit, len(ids))


def _trim(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, limit: int,
          first_size: int) -> Prompt:
    """Shorten unprotected messages oldest-first until the prompt fits."""
    messages = [dict(m) for m in messages]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user" and m.get("content")), default=-1)
    size = first_size
    for i, m in enumerate(messages):
        if i == last_user or m["role"] in ("system", "tool") or not isinstance(m.get("content"), str):
            continue
        tokens = encode(tokenizer, m["content"])
        lo, hi = 0, len(tokens)  # keep the largest prefix that fits
        best: tuple[int, str, list[int]] | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            m["content"] = tokenizer.decode(tokens[:mid])
            candidate = [x for x in messages if x.get("content") or x.get("tool_calls") or x["role"] != "assistant"]
            if not candidate:  # nothing would be left to answer: that does not fit either
                hi = mid - 1
                continue
            text = _render(tokenizer, candidate, tools)
            ids = encode(tokenizer, text)
            if len(ids) < limit:
                best = (mid, text, ids)
                lo = mid + 1
            else:
                hi = mid - 1
        if best is not None:
            m["content"] = tokenizer.decode(tokens[: best[0]])
            return Prompt(best[2], best[1], trimmed=True)
        m["content"] = ""
        rest = [x for x in messages if x.get("content") or x["role"] != "assistant"]
        if rest:
            size = len(encode(tokenizer, _render(tokenizer, rest, tools)))
    raise ContextTooLong(f"Prompt still exceeds context limit ({size} > {limit}) after trimming.",
                         code="context_limit_exceeded")
