"""`POST /v1/responses` request parsing: a stateless subset that refuses what it cannot honour.

`parse_response_request` turns an already-decoded JSON body into a `ResponseRequest`: the
`ChatRequest` the generator runs plus the values every Response object echoes back. Checks run
in a fixed order and each refusal is an `ApiError(400)` with the route's code and exact message.
Fields accepted with only a local meaning (the envelope the Codex CLI always sends) are type-checked
and then deliberately not acted on.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import string
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, urlsplit

from swama.engine.generator import ChatRequest, Sampling
from swama.handlers.errors import ApiError

TOP_LEVEL_FIELDS = frozenset({
    "model", "input", "instructions", "stream", "temperature", "top_p", "max_output_tokens", "tools",
    "tool_choice", "text", "truncation", "store", "background", "parallel_tool_calls",
    "client_metadata", "prompt_cache_key", "reasoning", "include",
})
ROLES = {"user": "user", "developer": "system", "system": "system", "assistant": "assistant", "tool": "tool"}
ITEM_STATUSES = frozenset({"in_progress", "completed", "incomplete"})
TEXT_PART_TYPES = frozenset({"input_text", "output_text", "text"})
TEXT_PART_KEYS = frozenset({"type", "text", "annotations", "logprobs"})
IMAGE_PART_KEYS = frozenset({"type", "image_url", "detail"})
MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status"})
FUNCTION_CALL_KEYS = frozenset({"type", "call_id", "name", "arguments", "id", "status"})
FUNCTION_OUTPUT_KEYS = frozenset({"type", "call_id", "output", "id", "status"})
FUNCTION_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
WEB_SEARCH_KEYS = frozenset({"type", "external_web_access"})
ENCRYPTED_REASONING = "reasoning.encrypted_content"
DEFAULT_TEMPERATURE = 0.6
DEFAULT_TOP_P = 1.0
MAX_EXACT_INTEGER = 2**53  # the largest range a JSON number carries exactly
OUT_OF_RANGE = "Generation options are outside their supported ranges."
# Characters a URL may carry unescaped; anything else (spaces, non-ASCII, quotes...) is refused.
_URL_CHARS = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]@!$&'()*+,;=%")
_MEDIA_SUBTYPE_CHARS = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")


# -- errors ----------------------------------------------------------------------------------------

def malformed(detail: str) -> ApiError:
    return ApiError(400, f"Malformed request: {detail}", code="invalid_value")


def unsupported(what: str) -> ApiError:
    return ApiError(400, f"`{what}` is not supported by this server; it is rejected rather than silently ignored",
                    code="unsupported_parameter")


def unsupported_tool(kind: str) -> ApiError:
    return ApiError(400, f"tool type `{kind}` is not supported; only custom `function` tools run locally",
                    code="unsupported_parameter")


def unforceable_tool_choice(choice: str) -> ApiError:
    return ApiError(400, f"tool_choice `{choice}` cannot be enforced by the local runtime and is rejected",
                    code="unsupported_parameter")


def missing_model() -> ApiError:
    return ApiError(400, "`model` is required", code="missing_required_parameter")


def empty_input() -> ApiError:
    return ApiError(400, "`input` must be a non-empty string or a non-empty array of input items",
                    code="missing_required_parameter")


def empty_body_error() -> ApiError:
    """For the caller: a request without a body."""
    return malformed("empty body")


def not_object_error() -> ApiError:
    """For the caller: a body that is JSON but not an object."""
    return malformed("top-level JSON must be an object")


def invalid_json_error(detail: str) -> ApiError:
    """For the caller: a body that does not parse as JSON."""
    return malformed(f"invalid JSON ({detail})")


# -- result ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputImage:
    """An `input_image` part with a well-formed URL; `field` (`input[i].content[j]`) locates it."""

    field: str
    image_url: str
    detail: str | None = None


@dataclass
class ResponseRequest:
    """A parsed request: what the generator runs and what the Response object echoes."""

    model: str
    chat: ChatRequest
    stream: bool = False
    instructions: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # echo form; empty for tool_choice "none"
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    max_output_tokens: int | None = None
    images: list[InputImage] = field(default_factory=list)  # the caller refuses them for text-only models


@dataclass
class _Turn:
    """A chat message before adjacent system turns are merged; text parts stay separate until then."""

    role: str
    parts: list[str]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str | None = None

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role, "content": "\n".join(self.parts)}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        return msg


# -- typed field readers ---------------------------------------------------------------------------

def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bool(obj: dict[str, Any], key: str) -> bool | None:
    if key not in obj:
        return None
    value = obj[key]
    if not isinstance(value, bool):
        raise malformed(f"`{key}` must be a JSON boolean")
    return value


def _string(obj: dict[str, Any], key: str) -> str | None:
    if key not in obj:
        return None
    if not isinstance(obj[key], str):
        raise malformed(f"`{key}` must be a JSON string")
    return obj[key]


def _number(obj: dict[str, Any], key: str) -> float | None:
    if key not in obj:
        return None
    value = obj[key]
    if not _is_number(value) or not math.isfinite(value):
        raise malformed(f"`{key}` must be a JSON number")
    return float(value)


def _integer(obj: dict[str, Any], key: str) -> int | None:
    if key not in obj:
        return None
    value = obj[key]
    if not _is_number(value):
        raise malformed(f"`{key}` must be a JSON integer")
    # An integral float (16.0) is the same JSON number as 16; 1e100 is integral but out of range.
    if not math.isfinite(value) or value != int(value) or abs(value) > MAX_EXACT_INTEGER:
        raise malformed(f"`{key}` must be an integer within the supported range")
    return int(value)


def _only_keys(obj: dict[str, Any], allowed: frozenset[str], surface: str) -> None:
    for key in sorted(obj):
        if key not in allowed:
            raise unsupported(f"{surface} `{key}`")


# -- top-level checks (in order) -------------------------------------------------------------------

def _check_model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise missing_model()
    return model


def _check_unknown_fields(data: dict[str, Any]) -> None:
    for key in sorted(data):
        if key not in TOP_LEVEL_FIELDS:
            raise unsupported(key)


def _check_state(data: dict[str, Any]) -> None:
    if _bool(data, "store"):
        raise unsupported("store:true")
    if _bool(data, "background"):
        raise unsupported("background:true")


def _check_codex_envelope(data: dict[str, Any]) -> None:
    if "client_metadata" in data and not isinstance(data["client_metadata"], dict):
        raise malformed("`client_metadata` must be a JSON object")
    _string(data, "prompt_cache_key")
    if "reasoning" in data:
        reasoning = data["reasoning"]
        if not isinstance(reasoning, dict):
            raise malformed("`reasoning` must be a JSON object")
        _only_keys(reasoning, frozenset({"summary"}), "reasoning")
        if "summary" in reasoning:
            if not isinstance(reasoning["summary"], str):
                raise malformed("`reasoning.summary` must be a JSON string")
            if reasoning["summary"] != "auto":
                raise unsupported("reasoning.summary")
    if "include" in data:
        include = data["include"]
        if not isinstance(include, list):
            raise malformed("`include` must be a JSON array")
        if any(entry != ENCRYPTED_REASONING for entry in include):
            raise unsupported("include")


def _check_text(data: dict[str, Any]) -> None:
    if "text" not in data:
        return
    text = data["text"]
    if not isinstance(text, dict):
        raise malformed("`text` must be a JSON object")
    for key in sorted(text):
        if key != "format":
            raise unsupported(f"text.{key}")
    if "format" in text:
        fmt = text["format"]
        if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
            raise malformed("`text.format` must be an object with a string `type`")
        _only_keys(fmt, frozenset({"type"}), "text.format")
        if fmt["type"] != "text":
            raise unsupported("text.format")


def _check_truncation(data: dict[str, Any]) -> None:
    mode = _string(data, "truncation")
    if mode is None or mode == "disabled":
        return
    if mode == "auto":
        raise unsupported("truncation:auto")
    raise malformed('`truncation` must be "disabled" or "auto"')


def _check_tool_choice(data: dict[str, Any]) -> str:
    if "tool_choice" not in data:
        return "auto"
    choice = data["tool_choice"]
    if choice in ("auto", "none"):
        return choice
    if isinstance(choice, str):
        raise unforceable_tool_choice(choice)
    if isinstance(choice, dict):
        kind = choice.get("type")
        raise unforceable_tool_choice(kind if isinstance(kind, str) else "object")
    raise unforceable_tool_choice("unknown")


# -- input items -----------------------------------------------------------------------------------

def _check_item_metadata(item: dict[str, Any], surface: str) -> None:
    if "id" in item:
        if not isinstance(item["id"], str):
            raise malformed(f"{surface} `id` must be a JSON string")
        if not item["id"]:
            raise malformed(f"{surface} `id` must not be empty")
    if "status" in item:
        status = item["status"]
        if not isinstance(status, str):
            raise malformed(f"{surface} `status` must be a JSON string")
        if status not in ITEM_STATUSES:
            raise unsupported(f"{surface} status `{status}`")


def _text_part(part: dict[str, Any]) -> str:
    _only_keys(part, TEXT_PART_KEYS, "text content part")
    # Clients replaying our own output echo these; only the empty forms we produce mean anything.
    for key in ("annotations", "logprobs"):
        if key not in part:
            continue
        if not isinstance(part[key], list):
            raise malformed(f"text content part `{key}` must be a JSON array")
        if part[key]:
            raise unsupported(f"text content part `{key}`")
    if not isinstance(part.get("text"), str):
        raise malformed("text content part requires a string `text`")
    return part["text"]


def _image_part(part: dict[str, Any], where: str) -> InputImage:
    _only_keys(part, IMAGE_PART_KEYS, "input_image part")
    if "detail" in part and part["detail"] != "auto":
        raise unsupported("input_image.detail")
    url = part.get("image_url")
    if not isinstance(url, str):
        raise malformed("input_image requires a valid image_url")
    if not valid_image_url(url):
        raise unsupported("input_image.image_url")
    return InputImage(where, url, part.get("detail"))


def _message_item(item: dict[str, Any], where: str, images: list[InputImage]) -> _Turn:
    _only_keys(item, MESSAGE_KEYS, "message item")
    _check_item_metadata(item, "message item")
    if "role" in item and not isinstance(item["role"], str):
        raise malformed("message item `role` must be a JSON string")
    role = item.get("role", "user")
    if role not in ROLES:
        raise malformed(f"unsupported role `{role}`")
    if "content" not in item:
        raise malformed("message item requires `content`")
    content = item["content"]
    if isinstance(content, str):
        return _Turn(ROLES[role], [content])
    if not isinstance(content, list):
        raise malformed("message content must be a string or array")
    texts: list[str] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise malformed("content parts must be typed objects")
        if part["type"] in TEXT_PART_TYPES:
            texts.append(_text_part(part))
        elif part["type"] == "input_image":
            images.append(_image_part(part, f"{where}.content[{j}]"))
        else:
            raise unsupported(f"content part `{part['type']}`")
    if not content:
        raise malformed("empty message content")
    return _Turn(ROLES[role], texts)


def _function_call_item(item: dict[str, Any]) -> _Turn:
    _only_keys(item, FUNCTION_CALL_KEYS, "function_call item")
    _check_item_metadata(item, "function_call item")
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise malformed("function_call item requires `call_id` and `name`")
    arguments = _json_object(item.get("arguments"))
    if arguments is None:
        raise malformed("function_call requires `arguments` as a JSON object string")
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return _Turn("assistant", [], tool_calls=[call])


def _json_object(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _function_output_item(item: dict[str, Any]) -> _Turn:
    _only_keys(item, FUNCTION_OUTPUT_KEYS, "function_call_output item")
    _check_item_metadata(item, "function_call_output item")
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise malformed("function_call_output item requires `call_id`")
    if not isinstance(item.get("output"), str):
        raise malformed("function_call_output item requires a string `output`")
    return _Turn("tool", [item["output"]], tool_call_id=call_id)


def _input_turns(data: dict[str, Any], images: list[InputImage]) -> list[_Turn]:
    turns: list[_Turn] = []
    instructions = data.get("instructions")
    if instructions:
        turns.append(_Turn("system", [instructions]))
    raw = data.get("input")
    if isinstance(raw, str) and raw:
        return [*turns, _Turn("user", [raw])]
    if not isinstance(raw, list) or not raw:
        raise empty_input()
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise malformed("input items must be objects")
        if "type" in item and not isinstance(item["type"], str):
            raise malformed("input item `type` must be a JSON string")
        kind = item.get("type", "message")
        if kind == "message":
            turns.append(_message_item(item, f"input[{i}]", images))
        elif kind == "function_call":
            turns.append(_function_call_item(item))
        elif kind == "function_call_output":
            turns.append(_function_output_item(item))
        else:
            raise unsupported(f"input item type `{kind}`")
    return turns


def merge_adjacent_system(turns: list[_Turn]) -> list[_Turn]:
    """Chat templates fail on two system turns in a row, which `instructions` plus `developer` items
    always produce; their parts are concatenated in order instead."""
    merged: list[_Turn] = []
    for turn in turns:
        prev = merged[-1] if merged else None
        if (prev is not None and prev.role == turn.role == "system"
                and not prev.tool_calls and not turn.tool_calls):
            merged[-1] = _Turn("system", prev.parts + turn.parts)
        else:
            merged.append(turn)
    return merged


# -- image URLs ------------------------------------------------------------------------------------

def valid_image_url(url: str) -> bool:
    """`data:image/<subtype>;base64,<payload>`, or http(s) with a host, no userinfo and a port in 1-65535."""
    if url.lower().startswith("data:"):
        return _valid_data_url(url)
    return _valid_http_url(url)


def _valid_data_url(url: str) -> bool:
    header, comma, payload = url.partition(",")
    if not comma:
        return False
    pieces = header.split(";")
    if len(pieces) != 2 or pieces[1].lower() != "base64":
        return False
    media = pieces[0]
    if not media.lower().startswith("data:image/") or media.count("/") != 1:
        return False
    subtype = media.split("/", 1)[1]
    if not subtype or not set(subtype) <= _MEDIA_SUBTYPE_CHARS:
        return False
    try:
        return bool(base64.b64decode(payload, validate=True))
    except (binascii.Error, ValueError):
        return False


def _valid_http_url(url: str) -> bool:
    if not url or not set(url) <= _URL_CHARS:
        return False
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a bad port or bracketed host
        return False
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return False
    if parts.username is not None or parts.password is not None:
        return False
    return _explicit_port_ok(parts) and (port is None or 1 <= port <= 65535)


def _explicit_port_ok(parts: SplitResult) -> bool:
    """A colon after the host must be followed by a decimal port (urlsplit accepts `host:`)."""
    host_port = parts.netloc.rpartition("@")[2]
    if host_port.startswith("["):
        rest = host_port.partition("]")[2]
    else:
        rest = host_port[host_port.find(":"):] if ":" in host_port else ""
    if not rest:
        return True
    digits = rest[1:]
    return rest[0] == ":" and digits.isascii() and digits.isdigit() and 1 <= int(digits) <= 65535


# -- sampling and tools ----------------------------------------------------------------------------

def _sampling(data: dict[str, Any]) -> tuple[Sampling, int | None]:
    max_tokens = _integer(data, "max_output_tokens")
    temperature = _number(data, "temperature")
    top_p = _number(data, "top_p")
    sampling = Sampling(temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
                        top_p=DEFAULT_TOP_P if top_p is None else top_p)
    # The engine's own range rules, applied here so a stream never starts on options it would refuse;
    # temperature also stays within the 0-2 the Response object can echo.
    if not (0 <= sampling.temperature <= 2 and 0 <= sampling.top_p <= 1) or (
            max_tokens is not None and max_tokens <= 0):
        raise ApiError(400, OUT_OF_RANGE, code="invalid_request")
    return sampling, max_tokens


def _web_search_tool(tool: dict[str, Any]) -> None:
    """Accepted only in the exact offline shape, and then dropped: no search ever runs here."""
    _only_keys(tool, WEB_SEARCH_KEYS, "web_search tool")
    if _bool(tool, "external_web_access") is not False:
        raise unsupported_tool("web_search")


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    _only_keys(tool, FUNCTION_TOOL_KEYS, "function tool")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise malformed("function tool requires a name")
    if _bool(tool, "strict"):
        raise unsupported("tools[].strict:true")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise malformed("tool `description` must be a JSON string")
    parameters = tool.get("parameters", {})
    if not isinstance(parameters, dict):
        raise malformed("tool `parameters` must be a JSON object")
    return {"type": "function", "name": name, "description": description, "parameters": parameters,
            "strict": False}


def _tools(data: dict[str, Any]) -> list[dict[str, Any]]:
    if "tools" not in data:
        return []
    raw = data["tools"]
    if not isinstance(raw, list):
        raise malformed("`tools` must be a JSON array")
    tools = []
    for tool in raw:
        if not isinstance(tool, dict):
            raise malformed("tools must be objects")
        # The kind is checked before the keys: a hosted tool's own fields would hide the real reason.
        kind = tool.get("type")
        if not isinstance(kind, str):
            raise malformed("tool requires a string `type`")
        if kind == "web_search":
            _web_search_tool(tool)
        elif kind == "function":
            tools.append(_function_tool(tool))
        else:
            raise unsupported_tool(kind)
    return tools


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An echoed function tool in the chat-template form the generator takes."""
    parameters = tool["parameters"] or {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": tool["name"], "description": tool["description"] or "",
                                             "parameters": parameters}}


# -- entry point -----------------------------------------------------------------------------------

def parse_response_request(data: Any, *, context_limit: int) -> ResponseRequest:
    """Validate a decoded `/v1/responses` body; raises `ApiError(400)` on the first refusal."""
    if not isinstance(data, dict):
        raise not_object_error()
    model = _check_model(data)
    _check_unknown_fields(data)
    _check_state(data)
    parallel = _bool(data, "parallel_tool_calls")
    _check_codex_envelope(data)
    _check_text(data)
    _check_truncation(data)
    instructions = _string(data, "instructions")
    tool_choice = _check_tool_choice(data)
    images: list[InputImage] = []
    messages = [t.message() for t in merge_adjacent_system(_input_turns(data, images))]
    if not messages:
        raise empty_input()
    sampling, max_tokens = _sampling(data)
    tools = _tools(data)
    if tool_choice == "none":  # enforced by never offering the tools to the model
        tools = []
    stream = _bool(data, "stream")
    chat = ChatRequest(messages=messages, sampling=sampling, max_tokens=max_tokens,
                       tools=[chat_tool(t) for t in tools] or None, context_limit=context_limit)
    return ResponseRequest(model=model, chat=chat, stream=bool(stream), instructions=instructions, tools=tools,
                           tool_choice=tool_choice, parallel_tool_calls=bool(parallel),
                           temperature=sampling.temperature, top_p=sampling.top_p,
                           max_output_tokens=max_tokens, images=images)
