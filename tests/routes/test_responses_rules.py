"""/v1/responses request parsing through the route's pipeline: every accept/reject rule, exact codes and
messages, check order."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from conftest import served_schema_accepts, stated_handler_rule

from swama.generated.routes import OPERATIONS
from swama.handlers.http.errors import ApiError, error_body
from swama.handlers.http.pipeline import parse_json_request, validate
from swama.handlers.media.images import ImageRef, valid_image_url
from swama.handlers.routes.responses import (
    ROUTE_RULES,
    ResponseRequest,
    response_request,
)
from swama.handlers.routes.turns import json_object

OP = OPERATIONS["createResponse"]

BASE: dict[str, Any] = {"model": "m", "input": "hi"}
DROP = object()
PNG = "data:image/png;base64,iVBORw0KGgo="


def body(base: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    request = copy.deepcopy(BASE if base is None else base)
    for key, value in changes.items():
        if value is DROP:
            request.pop(key, None)
        else:
            request[key] = value
    return request


def parse(data: Any, context_limit: int = 4096) -> ResponseRequest:
    """The route's pipeline on a decoded body (parse_json_request's steps after strict JSON decoding;
    this also reaches values strict JSON never yields, such as infinity)."""
    if not isinstance(data, dict):
        raise ROUTE_RULES.not_object(data)
    ROUTE_RULES.before_model(data)
    request = validate(OP.request_model, ROUTE_RULES, data)
    return response_request(request, context_limit=context_limit)


def refusal(data: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(data)
    err = info.value
    assert err.status == 400 and err.param is None
    return err


def items(*entries: Any, **changes: Any) -> dict[str, Any]:
    return body(input=list(entries), **changes)


def msg(content: Any = "hi", **extra: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": content, **extra}


def fn_tool(name: str = "f", **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}, **extra}


def fn_call(**extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"x": 1}', **extra}


def fn_output(**extra: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": "call_1", "output": "42", **extra}


def without(obj: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != key}


def malformed(detail: str) -> tuple[str, str]:
    return "invalid_value", f"Malformed request: {detail}"


def unsupported(what: str) -> tuple[str, str]:
    return ("unsupported_parameter",
            f"`{what}` is not supported by this server; it is rejected rather than silently ignored")


def tool_type(kind: str) -> tuple[str, str]:
    return "unsupported_parameter", f"tool type `{kind}` is not supported; only custom `function` tools run locally"


def tool_choice(choice: str) -> tuple[str, str]:
    return ("unsupported_parameter",
            f"tool_choice `{choice}` cannot be enforced by the local runtime and is rejected")


MISSING_MODEL = ("missing_required_parameter", "`model` is required")
EMPTY_INPUT = ("missing_required_parameter",
               "`input` must be a non-empty string or a non-empty array of input items")
OUT_OF_RANGE = ("invalid_request", "Generation options are outside their supported ranges.")
BAD_ARGUMENTS = malformed("function_call requires `arguments` as a JSON object string")
WEB_SEARCH = {"type": "web_search", "external_web_access": False}

REJECTED: list[tuple[str, Any, tuple[str, str]]] = [
    # body shape and model
    ("array body", [], malformed("top-level JSON must be an object")),
    ("string body", "hi", malformed("top-level JSON must be an object")),
    ("null body", None, malformed("top-level JSON must be an object")),
    ("model missing", body(model=DROP), MISSING_MODEL),
    ("model empty", body(model=""), MISSING_MODEL),
    ("model not a string", body(model=5), MISSING_MODEL),
    ("model checked before unknown keys", {"metadata": {}, "input": "x"}, MISSING_MODEL),
    # unknown top-level fields (server-side state, structured outputs, everything unlisted)
    *[(f"unknown {key}", body(**{key: value}), unsupported(key)) for key, value in [
        ("previous_response_id", "resp_1"), ("conversation", "conv_1"), ("prompt", {"id": "p"}),
        ("response_format", {"type": "json_object"}), ("max_tool_calls", 3), ("service_tier", "auto"),
        ("metadata", {}), ("user", "u"), ("safety_identifier", "s"), ("stream_options", {}),
        ("context_management", []), ("prompt_cache_retention", "24h"),
        ("frobnicate", True), ("messages", [])]],
    ("unknown keys in sorted order", body(zeta=1, alpha=1, mid=1), unsupported("alpha")),
    # store / background / parallel_tool_calls
    ("store true", body(store=True), unsupported("store:true")),
    ("store not a boolean", body(store="false"), malformed("`store` must be a JSON boolean")),
    ("store null", body(store=None), malformed("`store` must be a JSON boolean")),
    ("background true", body(background=True), unsupported("background:true")),
    ("background not a boolean", body(background=0), malformed("`background` must be a JSON boolean")),
    ("parallel_tool_calls not a boolean", body(parallel_tool_calls="yes"),
     malformed("`parallel_tool_calls` must be a JSON boolean")),
    # the Codex envelope
    ("client_metadata string", body(client_metadata="x"), malformed("`client_metadata` must be a JSON object")),
    ("client_metadata array", body(client_metadata=[]), malformed("`client_metadata` must be a JSON object")),
    ("client_metadata null", body(client_metadata=None), malformed("`client_metadata` must be a JSON object")),
    ("prompt_cache_key number", body(prompt_cache_key=5), malformed("`prompt_cache_key` must be a JSON string")),
    ("reasoning string", body(reasoning="auto"), malformed("`reasoning` must be a JSON object")),
    ("reasoning effort unknown", body(reasoning={"effort": "huge"}), unsupported("reasoning.effort")),
    ("reasoning effort number", body(reasoning={"effort": 3}), malformed("`reasoning.effort` must be a JSON string")),
    ("reasoning generate_summary", body(reasoning={"generate_summary": "auto"}),
     unsupported("reasoning `generate_summary`")),
    ("reasoning summary brief", body(reasoning={"summary": "brief"}), unsupported("reasoning.summary")),
    ("reasoning summary null", body(reasoning={"summary": None}),
     malformed("`reasoning.summary` must be a JSON string")),
    ("include string", body(include="reasoning.encrypted_content"), malformed("`include` must be a JSON array")),
    ("include other entry", body(include=["file_search_call.results"]), unsupported("include")),
    ("include mixed entries", body(include=["reasoning.encrypted_content", "file_search_call.results"]),
     unsupported("include")),
    ("include non-string entry", body(include=[1]), unsupported("include")),
    # text
    ("text string", body(text="plain"), malformed("`text` must be a JSON object")),
    ("text.verbosity", body(text={"verbosity": "low"}), unsupported("text.verbosity")),
    ("text.verbosity beside format", body(text={"format": {"type": "text"}, "verbosity": "low"}),
     unsupported("text.verbosity")),
    ("text.format string", body(text={"format": "text"}),
     malformed("`text.format` must be an object with a string `type`")),
    ("text.format without type", body(text={"format": {}}),
     malformed("`text.format` must be an object with a string `type`")),
    ("text.format other type", body(text={"format": {"type": "xml"}}), unsupported("text.format")),
    ("text.format json_schema without schema", body(text={"format": {"type": "json_schema", "name": "x"}}),
     malformed("the request does not match the schema")),
    ("text.format extra key", body(text={"format": {"type": "text", "strict": True}}),
     unsupported("text.format `strict`")),
    # truncation
    ("truncation auto", body(truncation="auto"), unsupported("truncation:auto")),
    ("truncation other string", body(truncation="none"), malformed('`truncation` must be "disabled" or "auto"')),
    ("truncation not a string", body(truncation=1), malformed("`truncation` must be a JSON string")),
    # instructions
    ("instructions number", body(instructions=5), malformed("`instructions` must be a JSON string")),
    ("instructions null", body(instructions=None), malformed("`instructions` must be a JSON string")),
    ("instructions items", body(instructions=[msg()]), malformed("`instructions` must be a JSON string")),
    # tool_choice
    ("tool_choice required without tools", body(tool_choice="required"),
     ("invalid_value", "tool_choice 'required' needs at least one function in tools.")),
    ("tool_choice other string", body(tool_choice="any"), tool_choice("any")),
    ("tool_choice function not among tools", body(tools=[fn_tool()], tool_choice={"type": "function", "name": "g"}),
     ("invalid_value", "tool_choice names function 'g', which is not among the request's tools.")),
    ("tool_choice web_search", body(tool_choice={"type": "web_search"}), tool_choice("web_search")),
    ("tool_choice allowed_tools", body(tool_choice={"type": "allowed_tools", "mode": "auto", "tools": []}),
     tool_choice("allowed_tools")),
    ("tool_choice untyped object", body(tool_choice={}), tool_choice("object")),
    ("tool_choice number", body(tool_choice=1), tool_choice("unknown")),
    ("tool_choice null", body(tool_choice=None), tool_choice("unknown")),
    # input
    ("input missing", body(input=DROP), EMPTY_INPUT),
    ("input empty string", body(input=""), EMPTY_INPUT),
    ("input empty array", body(input=[]), EMPTY_INPUT),
    ("input number", body(input=5), EMPTY_INPUT),
    ("input object", body(input=msg()), EMPTY_INPUT),
    ("instructions alone", body(input=DROP, instructions="be brief"), EMPTY_INPUT),
    ("input item not an object", items("hi"), malformed("input items must be objects")),
    ("input item type not a string", items({"type": 5, "content": "x"}),
     malformed("input item `type` must be a JSON string")),
    *[(f"input item {kind}", items({"type": kind, "id": "x"}), unsupported(f"input item type `{kind}`"))
      for kind in ("item_reference", "web_search_call", "custom_tool_call", "compaction")],
    ("reasoning item extra key", items({"type": "reasoning", "foo": 1}), unsupported("reasoning item `foo`")),
    ("reasoning item summary", items({"type": "reasoning", "summary": "x"}),
     malformed("reasoning item `summary` must be an array of summary_text parts")),
    # message items
    ("message extra key", items(msg(name="bob")), unsupported("message item `name`")),
    ("message id empty", items(msg(id="")), malformed("message item `id` must not be empty")),
    ("message id number", items(msg(id=5)), malformed("message item `id` must be a JSON string")),
    ("message status number", items(msg(status=1)), malformed("message item `status` must be a JSON string")),
    ("message status unknown", items(msg(status="banana")), unsupported("message item status `banana`")),
    ("message role number", items(msg(role=5)), malformed("message item `role` must be a JSON string")),
    ("message role unknown", items(msg(role="critic")), malformed("unsupported role `critic`")),
    ("message role null", items(msg(role=None)), malformed("message item `role` must be a JSON string")),
    ("message without content", items({"role": "user"}), malformed("message item requires `content`")),
    ("message content number", items(msg(5)), malformed("message content must be a string or array")),
    ("message content null", items(msg(None)), malformed("message content must be a string or array")),
    ("message content empty list", items(msg([])), malformed("empty message content")),
    ("content part not an object", items(msg(["hi"])), malformed("content parts must be typed objects")),
    ("content part untyped", items(msg([{"text": "hi"}])), malformed("content parts must be typed objects")),
    *[(f"content part {kind}", items(msg([{"type": kind}])), unsupported(f"content part `{kind}`"))
      for kind in ("input_file", "input_audio", "refusal", "image_url")],
    ("text part extra key", items(msg([{"type": "input_text", "text": "x", "cache_control": {}}])),
     unsupported("text content part `cache_control`")),
    ("text part annotations not a list", items(msg([{"type": "output_text", "text": "x", "annotations": {}}])),
     malformed("text content part `annotations` must be a JSON array")),
    ("text part annotations non-empty",
     items(msg([{"type": "output_text", "text": "x", "annotations": [{"type": "url_citation"}]}])),
     unsupported("text content part `annotations`")),
    ("text part logprobs non-empty", items(msg([{"type": "output_text", "text": "x", "logprobs": [{}]}])),
     unsupported("text content part `logprobs`")),
    ("text part logprobs null", items(msg([{"type": "output_text", "text": "x", "logprobs": None}])),
     malformed("text content part `logprobs` must be a JSON array")),
    ("text part without text", items(msg([{"type": "input_text"}])),
     malformed("text content part requires a string `text`")),
    ("text part text number", items(msg([{"type": "text", "text": 5}])),
     malformed("text content part requires a string `text`")),
    ("image part extra key", items(msg([{"type": "input_image", "image_url": PNG, "file_id": "f"}])),
     unsupported("input_image part `file_id`")),
    *[(f"image detail {detail}", items(msg([{"type": "input_image", "image_url": PNG, "detail": detail}])),
       unsupported("input_image.detail")) for detail in ("low", "high", "original", None)],
    ("image without url", items(msg([{"type": "input_image"}])),
     malformed("input_image requires a valid image_url")),
    ("image url object", items(msg([{"type": "input_image", "image_url": {"url": PNG}}])),
     malformed("input_image requires a valid image_url")),
    ("image url ftp", items(msg([{"type": "input_image", "image_url": "ftp://example.com/a.png"}])),
     unsupported("input_image.image_url")),
    # function_call items
    ("function_call extra key", items(fn_call(namespace="ns")), unsupported("function_call item `namespace`")),
    ("function_call status unknown", items(fn_call(status="done")), unsupported("function_call item status `done`")),
    ("function_call id empty", items(fn_call(id="")), malformed("function_call item `id` must not be empty")),
    ("function_call without call_id", items(without(fn_call(), "call_id")),
     malformed("function_call item requires `call_id` and `name`")),
    ("function_call empty call_id", items(fn_call(call_id="")),
     malformed("function_call item requires `call_id` and `name`")),
    ("function_call empty name", items(fn_call(name="")),
     malformed("function_call item requires `call_id` and `name`")),
    ("function_call name number", items(fn_call(name=5)),
     malformed("function_call item requires `call_id` and `name`")),
    ("function_call without arguments", items(without(fn_call(), "arguments")), BAD_ARGUMENTS),
    ("function_call empty arguments", items(fn_call(arguments="")), BAD_ARGUMENTS),
    ("function_call array arguments", items(fn_call(arguments="[1]")), BAD_ARGUMENTS),
    ("function_call scalar arguments", items(fn_call(arguments="1")), BAD_ARGUMENTS),
    ("function_call broken arguments", items(fn_call(arguments='{"a":')), BAD_ARGUMENTS),
    ("function_call object arguments", items(fn_call(arguments={"a": 1})), BAD_ARGUMENTS),
    ("function_call NaN arguments", items(fn_call(arguments='{"a": NaN}')), BAD_ARGUMENTS),
    # function_call_output items
    ("function_call_output extra key", items(fn_output(name="f")),
     unsupported("function_call_output item `name`")),
    ("function_call_output status unknown", items(fn_output(status="failed")),
     unsupported("function_call_output item status `failed`")),
    ("function_call_output without call_id", items({"type": "function_call_output", "output": "x"}),
     malformed("function_call_output item requires `call_id`")),
    ("function_call_output output number", items(fn_output(output=42)),
     malformed("function_call_output item requires a string `output`")),
    ("function_call_output output parts", items(fn_output(output=[{"type": "input_text", "text": "x"}])),
     malformed("function_call_output item requires a string `output`")),
    # sampling
    ("temperature string", body(temperature="hot"), malformed("`temperature` must be a JSON number")),
    ("temperature boolean", body(temperature=True), malformed("`temperature` must be a JSON number")),
    ("temperature null", body(temperature=None), malformed("`temperature` must be a JSON number")),
    ("temperature infinite", body(temperature=float("inf")), malformed("`temperature` must be a JSON number")),
    ("top_p string", body(top_p="1"), malformed("`top_p` must be a JSON number")),
    ("max_output_tokens string", body(max_output_tokens="16"),
     malformed("`max_output_tokens` must be a JSON integer")),
    ("max_output_tokens boolean", body(max_output_tokens=True),
     malformed("`max_output_tokens` must be a JSON integer")),
    ("max_output_tokens null", body(max_output_tokens=None),
     malformed("`max_output_tokens` must be a JSON integer")),
    ("max_output_tokens fraction", body(max_output_tokens=1.5),
     malformed("`max_output_tokens` must be an integer within the supported range")),
    ("max_output_tokens huge float", body(max_output_tokens=1e300),
     malformed("`max_output_tokens` must be an integer within the supported range")),
    ("max_output_tokens past 2^53", body(max_output_tokens=2**53 + 1),
     malformed("`max_output_tokens` must be an integer within the supported range")),
    ("temperature negative", body(temperature=-0.1), OUT_OF_RANGE),
    ("temperature above 2", body(temperature=2.5), OUT_OF_RANGE),
    ("top_p above 1", body(top_p=1.5), OUT_OF_RANGE),
    ("top_p negative", body(top_p=-0.1), OUT_OF_RANGE),
    ("max_output_tokens zero", body(max_output_tokens=0), OUT_OF_RANGE),
    ("max_output_tokens negative", body(max_output_tokens=-5), OUT_OF_RANGE),
    # tools
    ("tools object", body(tools={}), malformed("`tools` must be a JSON array")),
    ("tools null", body(tools=None), malformed("`tools` must be a JSON array")),
    ("tool not an object", body(tools=["f"]), malformed("tools must be objects")),
    ("tool untyped", body(tools=[{"name": "f"}]), malformed("tool requires a string `type`")),
    *[(f"hosted tool {kind}", body(tools=[{"type": kind, **extra}]), tool_type(kind)) for kind, extra in [
        ("file_search", {"vector_store_ids": ["vs"]}), ("computer_use_preview", {}), ("computer", {}),
        ("mcp", {"server_label": "s", "server_url": "https://example.com"}), ("code_interpreter", {}),
        ("image_generation", {}), ("local_shell", {}), ("shell", {}), ("custom", {"name": "c"}),
        ("namespace", {"name": "multi_agent_v1", "tools": []}), ("tool_search", {}),
        ("web_search_preview", {}), ("web_search_2025_08_26", {}), ("apply_patch", {})]],
    ("function tool chat shape", body(tools=[{"type": "function", "function": {"name": "f"}}]),
     unsupported("function tool `function`")),
    ("function tool extra key", body(tools=[fn_tool(defer_loading=True)]), unsupported("function tool `defer_loading`")),
    ("function tool without name", body(tools=[{"type": "function"}]), malformed("function tool requires a name")),
    ("function tool empty name", body(tools=[fn_tool("")]), malformed("function tool requires a name")),
    ("function tool strict string", body(tools=[fn_tool(strict="no")]), malformed("`strict` must be a JSON boolean")),
    ("function tool description number", body(tools=[fn_tool(description=5)]),
     malformed("tool `description` must be a JSON string")),
    ("function tool parameters string", body(tools=[fn_tool(parameters="{}")]),
     malformed("tool `parameters` must be a JSON object")),
    ("function tool parameters null", body(tools=[fn_tool(parameters=None)]),
     malformed("tool `parameters` must be a JSON object")),
    ("second tool checked", body(tools=[fn_tool(), {"type": "mcp"}]), tool_type("mcp")),
    # the offline web_search shape: every variation is a hard 400
    ("web_search online", body(tools=[{"type": "web_search", "external_web_access": True}]),
     tool_type("web_search")),
    ("web_search flag missing", body(tools=[{"type": "web_search"}]), tool_type("web_search")),
    ("web_search flag string", body(tools=[{"type": "web_search", "external_web_access": "false"}]),
     malformed("`external_web_access` must be a JSON boolean")),
    ("web_search flag null", body(tools=[{"type": "web_search", "external_web_access": None}]),
     malformed("`external_web_access` must be a JSON boolean")),
    *[(f"web_search with {key}", body(tools=[{**WEB_SEARCH, key: value}]), unsupported(f"web_search tool `{key}`"))
      for key, value in [("filters", {"allowed_domains": ["a.com"]}), ("search_context_size", "low"),
                         ("user_location", {"type": "approximate"})]],
    ("web_search named by tool_choice", body(tools=[WEB_SEARCH], tool_choice={"type": "web_search"}),
     tool_choice("web_search")),
    ("web_search tools still checked under tool_choice none",
     body(tools=[{"type": "web_search", "external_web_access": True}], tool_choice="none"), tool_type("web_search")),
    ("hosted tools still checked under tool_choice none", body(tools=[{"type": "mcp"}], tool_choice="none"),
     tool_type("mcp")),
    # stream
    ("stream string", body(stream="true"), malformed("`stream` must be a JSON boolean")),
    ("stream number", body(stream=1), malformed("`stream` must be a JSON boolean")),
    ("stream null", body(stream=None), malformed("`stream` must be a JSON boolean")),
]


@pytest.mark.parametrize("data,expected", [pytest.param(d, e, id=name) for name, d, e in REJECTED])
def test_rejected(data: Any, expected: tuple[str, str]) -> None:
    err = refusal(data)
    assert (err.code, err.message) == expected


BAD_URLS = [
    "ftp://example.com/a.png", "file:///etc/passwd", "javascript:alert(1)", "example.com/a.png", "//example.com/a",
    "http:///a.png", "http://user:pw@example.com/a.png", "https://user@example.com/a.png", "http://example.com:0/",
    "http://example.com:65536/", "http://example.com:/a", "http://example.com:8x/", "http://[::1/",
    "http://exa mple.com/", "http://example.com/a b.png", "http://ex\u00e4mple.com/",
    "data:text/plain;base64,aGk=", "data:image/png,iVBORw0KGgo=", "data:image/png;base64,", "data:image/png;base64,!!",
    "data:image/png;base64,aGk", "data:image/;base64,aGk=", "data:image/png/x;base64,aGk=",
    "data:image/png;charset=x;base64,aGk=", "data:image/p ng;base64,aGk=", "data:;base64,aGk=", "data:image/png",
]
GOOD_URLS = [
    PNG, "DATA:IMAGE/JPEG;BASE64,aGk=", "data:image/svg+xml;base64,PHN2Zy8+", "http://example.com/a.png",
    "https://example.com:8443/img?x=1#frag", "https://127.0.0.1/a.png", "http://[::1]:8080/a.png",
    "HTTPS://Example.com/a%20b.png", "http://example.com:65535/", "http://example.com:1/",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_image_url_rejected(url: str) -> None:
    assert not valid_image_url(url)
    err = refusal(items(msg([{"type": "input_image", "image_url": url}])))
    assert (err.code, err.message) == unsupported("input_image.image_url")


@pytest.mark.parametrize("url", GOOD_URLS)
def test_image_url_accepted(url: str) -> None:
    assert valid_image_url(url)
    req = parse(items(msg([{"type": "input_image", "image_url": url, "detail": "auto"}])))
    assert req.images == [ImageRef("input[0].content[0]", url, "auto")]


# -- check order -----------------------------------------------------------------------------------

ORDERED_FAULTS: list[tuple[dict[str, Any], tuple[str, str]]] = [
    ({"model": ""}, MISSING_MODEL),
    ({"metadata": {}}, unsupported("metadata")),
    ({"store": True}, unsupported("store:true")),
    ({"parallel_tool_calls": 1}, malformed("`parallel_tool_calls` must be a JSON boolean")),
    ({"reasoning": {"effort": "high", "mode": "x"}}, unsupported("reasoning `mode`")),
    ({"text": {"format": {"type": "xml"}}}, unsupported("text.format")),
    ({"truncation": "auto"}, unsupported("truncation:auto")),
    ({"instructions": 5}, malformed("`instructions` must be a JSON string")),
    ({"tool_choice": "any"}, tool_choice("any")),
    ({"input": [{"type": "compaction"}]}, unsupported("input item type `compaction`")),
    ({"temperature": "hot"}, malformed("`temperature` must be a JSON number")),
    ({"tools": [{"type": "namespace"}]}, tool_type("namespace")),
    ({"stream": "yes"}, malformed("`stream` must be a JSON boolean")),
]


def test_checks_run_in_order() -> None:
    """With every fault present, each is reported only after the ones before it are fixed."""
    for start in range(len(ORDERED_FAULTS)):
        data = body(model="m")
        for fault, _ in ORDERED_FAULTS[start:]:
            data.update(fault)
        err = refusal(data)
        assert (err.code, err.message) == ORDERED_FAULTS[start][1]


def test_order_within_envelope_and_sampling() -> None:
    data = body(client_metadata=1, prompt_cache_key=1, reasoning=1, include=1)
    assert refusal(data).message == malformed("`client_metadata` must be a JSON object")[1]
    data = body(max_output_tokens="x", temperature="x", top_p="x")
    assert refusal(data).message == malformed("`max_output_tokens` must be a JSON integer")[1]
    data = body(temperature="x", top_p="x")
    assert refusal(data).message == malformed("`temperature` must be a JSON number")[1]


def test_input_items_are_checked_in_order() -> None:
    err = refusal(items(msg(role="critic"), {"type": "compaction"}))
    assert err.message == "Malformed request: unsupported role `critic`"


ARGUMENTS = ["", " ", "null", "[1]", "1", '"{}"', "{", '{"a":', "}{", '{"a": NaN}', "{}{}", "{} x",
             "{}", ' {"x": 1}\n', '{"a": [1, {"b": null}]}']


@pytest.mark.parametrize("arguments", ARGUMENTS)
def test_the_served_document_states_function_call_arguments(arguments: str) -> None:
    """`arguments` holds a JSON object. The served schema says so (its braces by a pattern, the rest
    as contentSchema): what it refuses the route refuses, and what it allows is accepted unless a
    rule the overlay lists as handler-only refuses it."""
    item = fn_call(arguments=arguments)
    stated = served_schema_accepts("ResponsesRequestFunctionCallItem", item)
    if json_object(arguments) is not None:
        assert stated
        assert parse(items(item, fn_output())).chat.messages[0]["tool_calls"][0]["function"]["arguments"] == \
            json.loads(arguments)
        return
    err = refusal(items(item))
    assert (err.code, err.message) == BAD_ARGUMENTS
    assert not stated or stated_handler_rule("createResponse", err.message)
    if arguments.strip() in ("", "null", "[1]", "1", '"{}"', "{"):
        assert not stated


def test_empty_arguments_are_refused_in_the_input_walk() -> None:
    # the schema refuses them, so they are reported where the route walks the input: before sampling
    assert (refusal(items(fn_call(arguments=""), max_output_tokens="x")).message) == BAD_ARGUMENTS[1]


def test_unknown_key_message_has_the_error_envelope() -> None:
    err = refusal(body(metadata={}))
    assert error_body("openai", err) == {"error": {
        "message": "`metadata` is not supported by this server; it is rejected rather than silently ignored",
        "type": "invalid_request_error", "param": None, "code": "unsupported_parameter"}}


@pytest.mark.parametrize("raw,message", [
    (b"", "Malformed request: empty body"),
    (b"  \n", "Malformed request: empty body"),
    (b"[1]", "Malformed request: top-level JSON must be an object"),
    (b'{"model": "m", "model": "n"}', None),
])
def test_body_errors(raw: bytes, message: str | None) -> None:
    with pytest.raises(ApiError) as info:
        parse_json_request(OP, ROUTE_RULES, raw)
    err = info.value
    assert (err.status, err.code, err.param) == (400, "invalid_value", None)
    assert err.message == message if message else err.message.startswith("Malformed request: invalid JSON (")


# -- accepted ----------------------------------------------------------------------------------------

def test_minimal_request_defaults() -> None:
    req = parse(BASE, context_limit=1234)
    assert req.model == "m" and req.stream is False
    assert req.chat.messages == [{"role": "user", "content": "hi"}]
    assert (req.temperature, req.top_p, req.max_output_tokens) == (0.6, 1.0, None)
    assert (req.chat.sampling.temperature, req.chat.sampling.top_p, req.chat.max_tokens) == (0.6, 1.0, None)
    assert req.chat.context_limit == 1234 and req.chat.tools is None and req.chat.stop == []
    assert (req.tools, req.tool_choice, req.parallel_tool_calls, req.instructions, req.images) == (
        [], "auto", True, None, [])


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("store false", body(store=False)),
    ("background false", body(background=False)),
    ("parallel_tool_calls false", body(parallel_tool_calls=False)),
    ("client_metadata empty", body(client_metadata={})),
    ("client_metadata strings", body(client_metadata={"x-codex-turn": "1", "session": "abc"})),
    ("prompt_cache_key", body(prompt_cache_key="0b6f6c2e-6c39-4c1c-9d2b-8c7a6e1f2d3c")),
    ("reasoning empty", body(reasoning={})),
    ("reasoning summary auto", body(reasoning={"summary": "auto"})),
    ("reasoning summary detailed", body(reasoning={"summary": "detailed"})),
    ("reasoning effort low", body(reasoning={"effort": "low"})),
    ("reasoning effort with auto summary", body(reasoning={"summary": "auto", "effort": "high"})),
    ("reasoning item back", items({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}],
                                   "encrypted_content": None})),
    ("include empty", body(include=[])),
    ("include encrypted_content", body(include=["reasoning.encrypted_content"])),
    ("include encrypted_content twice", body(include=["reasoning.encrypted_content"] * 2)),
    ("text empty", body(text={})),
    ("text format text", body(text={"format": {"type": "text"}})),
    ("truncation disabled", body(truncation="disabled")),
    ("tool_choice auto", body(tool_choice="auto")),
    ("tool_choice required", body(tools=[fn_tool()], tool_choice="required")),
    ("text format json_object", body(text={"format": {"type": "json_object"}})),
    ("text format json_schema", body(text={"format": {"type": "json_schema", "name": "x", "schema": {}}})),
    ("function tool strict true", body(tools=[fn_tool(strict=True)])),
    ("include logprobs", body(include=["message.output_text.logprobs"], top_logprobs=3)),
    ("tool_choice none", body(tool_choice="none")),
    ("stream false", body(stream=False)),
    ("stream true", body(stream=True)),
    ("empty tools", body(tools=[])),
    ("strict false", body(tools=[fn_tool(strict=False)])),
    ("description null", body(tools=[fn_tool(description=None)])),
    ("parameters omitted", body(tools=[{"type": "function", "name": "f"}])),
    ("web_search offline", body(tools=[WEB_SEARCH])),
    ("temperature zero and integer", body(temperature=0)),
    ("temperature two", body(temperature=2)),
    ("top_p zero", body(top_p=0)),
    ("max_output_tokens 2^53", body(max_output_tokens=2**53)),
    ("message item without type or role", items({"content": "hi"})),
    ("message item metadata", items(msg(id="msg_1", status="completed"))),
    ("empty string content", items(msg(""))),
]


@pytest.mark.parametrize("data", [pytest.param(d, id=name) for name, d in ACCEPTED])
def test_accepted(data: dict[str, Any]) -> None:
    assert isinstance(parse(data), ResponseRequest)


@pytest.mark.parametrize("status", ["in_progress", "completed", "incomplete"])
def test_item_statuses_accepted(status: str) -> None:
    parse(items(msg(status=status), fn_call(status=status, id="fc_1"), fn_output(status=status, id="fco_1")))


def test_echoed_values() -> None:
    req = parse(body(temperature=1, top_p=0.5, max_output_tokens=16.0, parallel_tool_calls=True, stream=True,
                     instructions="Be brief.", tool_choice="auto"))
    assert (req.temperature, req.top_p, req.max_output_tokens, req.parallel_tool_calls, req.stream) == (
        1.0, 0.5, 16, True, True)
    assert isinstance(req.temperature, float) and isinstance(req.max_output_tokens, int)
    assert (req.chat.sampling.temperature, req.chat.sampling.top_p, req.chat.max_tokens) == (1.0, 0.5, 16)
    assert req.instructions == "Be brief."


def test_function_tools_echo_and_chat_form() -> None:
    params = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
    req = parse(body(tools=[fn_tool("exec", description="Run", parameters=params, strict=False),
                            {"type": "function", "name": "bare", "description": None}, WEB_SEARCH]))
    assert req.tools == [
        {"type": "function", "name": "exec", "description": "Run", "parameters": params, "strict": False},
        {"type": "function", "name": "bare", "description": None, "parameters": {}, "strict": False},
    ]
    assert req.chat.tools == [
        {"type": "function", "function": {"name": "exec", "description": "Run", "parameters": params}},
        {"type": "function", "function": {"name": "bare", "description": "",
                                          "parameters": {"type": "object", "properties": {}}}},
    ]


def test_tool_choice_none_removes_the_tools() -> None:
    req = parse(body(tools=[fn_tool(), WEB_SEARCH], tool_choice="none"))
    assert req.tool_choice == "none" and req.tools == [] and req.chat.tools is None


def test_web_search_offline_is_dropped() -> None:
    req = parse(body(tools=[WEB_SEARCH]))
    assert req.tools == [] and req.chat.tools is None
    req = parse(body(tools=[WEB_SEARCH, fn_tool("exec")]))
    assert [t["name"] for t in req.tools] == ["exec"]
    assert [t["function"]["name"] for t in req.chat.tools or []] == ["exec"]


def test_instructions_become_the_first_system_turn() -> None:
    req = parse(body(instructions="Be brief."))
    assert req.chat.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    req = parse(body(instructions=""))
    assert req.chat.messages == [{"role": "user", "content": "hi"}] and req.instructions == ""


def test_roles() -> None:
    req = parse(items(msg("d", role="developer"), msg("u"), msg("s", role="system"), msg("a", role="assistant"),
                      msg("t", role="tool"), {"content": "default"}))
    assert [(m["role"], m["content"]) for m in req.chat.messages] == [
        ("system", "d"), ("user", "u"), ("system", "s"), ("assistant", "a"), ("tool", "t"), ("user", "default")]


def test_text_parts_join_in_order() -> None:
    parts = [{"type": "input_text", "text": "one"}, {"type": "text", "text": "two"},
             {"type": "output_text", "text": "three", "annotations": [], "logprobs": []}]
    req = parse(items(msg(parts)))
    assert req.chat.messages == [{"role": "user", "content": "one\ntwo\nthree"}]


def test_adjacent_system_turns_merge() -> None:
    req = parse(items(msg([{"type": "input_text", "text": "dev one"}, {"type": "input_text", "text": "dev two"}],
                          role="developer"),
                      msg("sys", role="system"), msg("u1"), msg("dev three", role="developer"), msg("u2"),
                      msg("d4", role="developer"), msg("d5", role="developer"), instructions="instr"))
    assert req.chat.messages == [
        {"role": "system", "content": "instr\ndev one\ndev two\nsys"},
        {"role": "user", "content": "u1"},
        {"role": "system", "content": "dev three"},
        {"role": "user", "content": "u2"},
        {"role": "system", "content": "d4\nd5"},
    ]


def test_non_system_turns_are_not_merged() -> None:
    req = parse(items(msg("a"), msg("b"), msg("c", role="assistant"), msg("d", role="assistant")))
    assert [m["content"] for m in req.chat.messages] == ["a", "b", "c", "d"]


def test_function_call_round_trip_mapping() -> None:
    req = parse(items(
        msg("list files", role="user"),
        {"type": "function_call", "call_id": "call_A", "name": "exec_command",
         "arguments": '{"cmd": ["ls", "-la"], "timeout": 5}', "id": "fc_1", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_A", "output": "a.txt\nb.txt"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Two files.", "annotations": []}]},
        msg("thanks"),
    ))
    assert req.chat.messages == [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_A", "type": "function",
             "function": {"name": "exec_command", "arguments": {"cmd": ["ls", "-la"], "timeout": 5}}}]},
        {"role": "tool", "content": "a.txt\nb.txt", "tool_call_id": "call_A"},
        {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "thanks"},
    ]


def test_each_function_call_is_its_own_assistant_turn() -> None:
    req = parse(items(msg("go"), fn_call(call_id="c1"), fn_call(call_id="c2"), fn_output(call_id="c1"),
                      fn_output(call_id="c2")))
    roles = [(m["role"], m.get("tool_call_id")) for m in req.chat.messages]
    assert roles == [("user", None), ("assistant", None), ("assistant", None), ("tool", "c1"), ("tool", "c2")]
    assert [m["tool_calls"][0]["id"] for m in req.chat.messages[1:3]] == ["c1", "c2"]


def test_system_after_function_call_is_not_merged_into_it() -> None:
    req = parse(items(msg("s1", role="system"), fn_call(), msg("s2", role="system"), msg("s3", role="developer")))
    assert [(m["role"], m["content"]) for m in req.chat.messages] == [
        ("system", "s1"), ("assistant", ""), ("system", "s2\ns3")]


def test_images_are_kept_for_the_caller() -> None:
    url = "https://example.com/cat.png"
    req = parse(items(msg("first"), msg([{"type": "input_text", "text": "what is this?"},
                                         {"type": "input_image", "image_url": PNG},
                                         {"type": "input_image", "image_url": url, "detail": "auto"}])))
    assert req.images == [ImageRef("input[1].content[1]", PNG, None),
                          ImageRef("input[1].content[2]", url, "auto")]
    assert req.chat.messages[1] == {"role": "user", "content": [  # parts in order, for the chat template
        {"type": "text", "text": "what is this?"}, {"type": "image"}, {"type": "image"}]}
    only_image = parse(items(msg([{"type": "input_image", "image_url": PNG}])))
    assert only_image.chat.messages == [{"role": "user", "content": [{"type": "image"}]}] and len(only_image.images) == 1


# -- the Codex CLI envelope --------------------------------------------------------------------------

def _codex_tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": f"{name} tool", "strict": False,
            "parameters": {"type": "object", "properties": properties, "required": list(properties),
                           "additionalProperties": False}}


def codex_body() -> dict[str, Any]:
    text = {"type": "input_text"}
    return {
        "model": "local-model",
        "instructions": "You are Codex, a coding agent.",
        "input": [
            {"type": "message", "role": "developer", "content": [{**text, "text": "<permissions>read-only</permissions>"}]},
            {"type": "message", "role": "developer", "content": [{**text, "text": "<collaboration_mode/>"}]},
            {"type": "message", "role": "user", "content": [{**text, "text": "<environment_context/>"}]},
            {"type": "message", "role": "user", "content": [{**text, "text": "Reply with PONG"}]},
        ],
        "tools": [
            _codex_tool("exec_command", {"cmd": {"type": "string"}, "workdir": {"type": "string"}}),
            _codex_tool("write_stdin", {"session_id": {"type": "number"}, "chars": {"type": "string"}}),
            _codex_tool("request_user_input", {"questions": {"type": "array", "items": {"type": "object"}}}),
            _codex_tool("view_image", {"path": {"type": "string"}}),
            _codex_tool("get_goal", {}),
            _codex_tool("create_goal", {"objective": {"type": "string"}}),
            _codex_tool("update_goal", {"status": {"type": "string"}}),
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "6f1c1a5e-2b7d-4d8e-9a51-0c3f4b2e7d10",
        "client_metadata": {"x-codex-installation-id": "8c3a", "x-codex-window-id": "w-1"},
    }


CODEX_FUNCTIONS = ["exec_command", "write_stdin", "request_user_input", "view_image", "get_goal", "create_goal",
                   "update_goal"]


def test_codex_request_is_accepted() -> None:
    req = parse(json.loads(json.dumps(codex_body())))
    assert req.model == "local-model" and req.stream is True and req.parallel_tool_calls is True
    assert req.tool_choice == "auto" and req.images == []
    assert [t["name"] for t in req.tools] == CODEX_FUNCTIONS
    assert all(t["type"] == "function" and t["strict"] is False for t in req.tools)
    chat_tools = req.chat.tools or []
    assert [t["function"]["name"] for t in chat_tools] == CODEX_FUNCTIONS
    assert "web_search" not in json.dumps(chat_tools) and "web_search" not in json.dumps(req.tools)
    assert req.chat.messages == [
        {"role": "system", "content": "You are Codex, a coding agent.\n<permissions>read-only</permissions>\n"
                                      "<collaboration_mode/>"},
        {"role": "user", "content": "<environment_context/>"},
        {"role": "user", "content": "Reply with PONG"},
    ]


def test_codex_request_with_namespace_tool_is_refused() -> None:
    data = codex_body()
    data["tools"].insert(7, {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents",
                             "tools": [_codex_tool("spawn_agent", {"task": {"type": "string"}})]})
    err = refusal(data)
    assert (err.code, err.message) == (
        "unsupported_parameter", "tool type `namespace` is not supported; only custom `function` tools run locally")


@pytest.mark.parametrize("change,expected", [
    ({"reasoning": {"summary": "auto", "effort": "medium", "context": "auto"}}, unsupported("reasoning `context`")),
    ({"include": ["reasoning.encrypted_content", "message.input_image.image_url"]}, unsupported("include")),
    ({"store": True}, unsupported("store:true")),
    ({"prompt_cache_key": None}, malformed("`prompt_cache_key` must be a JSON string")),
    ({"client_metadata": "x"}, malformed("`client_metadata` must be a JSON object")),
])
def test_codex_envelope_variations_are_refused(change: dict[str, Any], expected: tuple[str, str]) -> None:
    err = refusal({**codex_body(), **change})
    assert (err.code, err.message) == expected


def test_parsing_does_not_mutate_the_body() -> None:
    data = codex_body()
    snapshot = copy.deepcopy(data)
    parse(data)
    assert data == snapshot
