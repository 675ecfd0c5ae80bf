"""`POST /v1/responses`: the route's exact messages for what its generated model refuses.

`schema_error` words the errors of the generated `CreateResponse` (narrowed in
specs/overlays/openai.yaml) with the route's codes and messages and, when several fields are wrong,
reports the one the route's check order reaches first: a table keyed on the user's path and the
pydantic error type. `check_nulls` words explicit nulls the same way, since the generated models read
them as absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pydantic

from swama.engine.client import OUT_OF_RANGE
from swama.handlers.http.errors import ApiError
from swama.handlers.http.pipeline import RouteRules
from swama.handlers.http.strict_json import StrictJSONError

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


def out_of_range() -> ApiError:
    return ApiError(400, OUT_OF_RANGE, code="invalid_request")


def bad_json(error: StrictJSONError | None) -> ApiError:
    return malformed("empty body" if error is None else f"invalid JSON ({error})")


def not_object(_: Any) -> ApiError:
    return malformed("top-level JSON must be an object")


# -- schema errors, in the route's check order -----------------------------------------------------

MESSAGE, CALL, OUTPUT, REASONING = "message", "function_call", "function_call_output", "reasoning"
# Input items have no discriminator (`type` defaults to message): pydantic tries each member by class.
ITEM_MEMBERS = {"ResponsesRequestMessageItem": MESSAGE, "ResponsesRequestFunctionCallItem": CALL,
                "ResponsesRequestFunctionCallOutputItem": OUTPUT, "ResponsesRequestReasoningItem": REASONING}
# Discriminator tags of content parts and tools, named by the rules below.
TAG_MEMBERS = {"input_text": "text", "output_text": "text", "text": "text", "input_image": "input_image",
               "function": "function", "web_search": "web_search", "json_object": "json_object",
               "json_schema": "json_schema"}
# Names pydantic gives the members of a plain (not discriminated) union.
_UNION_TAGS = {"str", "bool", "int", "float", "list", "dict", "nullable"}

@dataclass(frozen=True)
class Fault:
    """One schema error as the user sees it: the path they wrote, the error type, the value there.

    `members` are the union members the error was found in, outermost first (an input item's class,
    then a content part's or a tool's type); kind `null` marks an explicit null the schema does not allow.
    """

    path: tuple[str | int, ...]
    kind: str
    value: Any
    members: tuple[str, ...] = ()

    @property
    def member(self) -> str | None:
        return self.members[-1] if self.members else None

    @property
    def item(self) -> str | None:
        return self.members[0] if self.members and self.members[0] in (MESSAGE, CALL, OUTPUT, REASONING) else None

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(p for p in self.path if isinstance(p, int))

    def matches(self, pattern: str) -> bool:
        keys = pattern.split(".")
        return len(keys) == len(self.path) and all(
            k == "*" if isinstance(p, int) else k in ("?", p) for k, p in zip(keys, self.path, strict=True))


WRONG_TYPE = frozenset({"string_type", "bool_type", "float_type", "int_type", "dict_type", "list_type",
                        "model_type", "model_attributes_type", "null", "missing"})
ALL = frozenset()  # any error type

Word = Callable[[Fault], ApiError | None]


@dataclass(frozen=True)
class Rule:
    group: int  # the route's check order between fields
    pattern: str  # dotted user path; `*` is an array index, `?` any one key
    kinds: frozenset[str]  # error types it words; empty: all
    word: Word
    member: str | None = None


def _const(error: ApiError) -> Word:
    return lambda _: error


def _typed(expected: type | tuple[type, ...], wrong: ApiError, refused: Word) -> Word:
    """A value of the wrong JSON type gets `wrong`; the right type with a refused value, `refused`."""

    def word(fault: Fault) -> ApiError | None:
        if fault.kind in WRONG_TYPE or isinstance(fault.value, bool) != (expected is bool) or (
                not isinstance(fault.value, expected)):
            return wrong
        return refused(fault)

    return word


def _key(surface: str) -> Word:
    return lambda fault: unsupported(f"{surface} `{fault.path[-1]}`")


def _tool_choice(fault: Fault) -> ApiError:
    value = fault.value
    if isinstance(value, str):
        return unforceable_tool_choice(value)
    if isinstance(value, dict):
        return unforceable_tool_choice(value["type"] if isinstance(value.get("type"), str) else "object")
    return unforceable_tool_choice("unknown")


def _choice_type(fault: Fault) -> ApiError:
    """A tool_choice object that is not a function choice: named by its type."""
    return unforceable_tool_choice(fault.value if isinstance(fault.value, str) else "object")


def _truncation(fault: Fault) -> ApiError:
    return unsupported("truncation:auto") if fault.value == "auto" else malformed(
        '`truncation` must be "disabled" or "auto"')


def _item_type(fault: Fault) -> ApiError:
    if isinstance(fault.value, str):
        return unsupported(f"input item type `{fault.value}`")
    return malformed("input item `type` must be a JSON string")


def _number(name: str) -> ApiError:
    return malformed(f"`{name}` must be a JSON number")


def _finite_range(name: str) -> Word:
    """Out of range; infinity (which strict JSON never yields) is not a JSON number at all."""
    return lambda fault: out_of_range() if fault.value == fault.value and abs(fault.value) != float("inf") \
        else _number(name)


def _integer_range(fault: Fault) -> ApiError:
    if fault.kind == "greater_than_equal" and fault.value == int(fault.value):
        return out_of_range()
    return malformed("`max_output_tokens` must be an integer within the supported range")


EXTRA = frozenset({"extra_forbidden"})
NOT_NULL = frozenset({"string_type", "list_type", "dict_type", "model_type", "model_attributes_type", "missing",
                      "literal_error", "enum", "extra_forbidden"})
RANGE = frozenset({"greater_than_equal", "less_than_equal"})


def _metadata(surface: str, member: str, group: int) -> list[Rule]:
    return [
        Rule(group, "input.*.id", WRONG_TYPE, _const(malformed(f"{surface} `id` must be a JSON string")), member),
        Rule(group, "input.*.id", ALL, _const(malformed(f"{surface} `id` must not be empty")), member),
        Rule(group, "input.*.status", ALL, _typed(str, malformed(f"{surface} `status` must be a JSON string"),
                                                  lambda f: unsupported(f"{surface} status `{f.value}`")), member),
    ]


def _boolean(name: str) -> ApiError:
    return malformed(f"`{name}` must be a JSON boolean")


def _envelope_rules() -> list[Rule]:
    """The request's own fields, before its input."""
    text_format = malformed("`text.format` must be an object with a string `type`")
    return [
        Rule(0, "?", EXTRA, lambda f: unsupported(str(f.path[0]))),
        Rule(1, "store", ALL, _typed(bool, _boolean("store"), _const(unsupported("store:true")))),
        Rule(1, "background", ALL, _typed(bool, _boolean("background"), _const(unsupported("background:true")))),
        Rule(2, "parallel_tool_calls", ALL, _const(_boolean("parallel_tool_calls"))),
        # the envelope the Codex CLI always sends
        Rule(3, "client_metadata", ALL, _const(malformed("`client_metadata` must be a JSON object"))),
        Rule(3, "prompt_cache_key", ALL, _const(malformed("`prompt_cache_key` must be a JSON string"))),
        Rule(3, "reasoning", WRONG_TYPE, _const(malformed("`reasoning` must be a JSON object"))),
        Rule(3, "reasoning.?", EXTRA, _key("reasoning")),
        Rule(3, "reasoning.summary", ALL, _typed(str, malformed("`reasoning.summary` must be a JSON string"),
                                                 _const(unsupported("reasoning.summary")))),
        Rule(3, "reasoning.effort", ALL, _typed(str, malformed("`reasoning.effort` must be a JSON string"),
                                                _const(unsupported("reasoning.effort")))),
        Rule(3, "include", WRONG_TYPE, _const(malformed("`include` must be a JSON array"))),
        Rule(3, "include.*", ALL, _const(unsupported("include"))),
        Rule(4, "text", WRONG_TYPE, _const(malformed("`text` must be a JSON object"))),
        Rule(4, "text.?", EXTRA, lambda f: unsupported(f"text.{f.path[-1]}")),
        Rule(4, "text.format", WRONG_TYPE, _const(text_format)),
        Rule(4, "text.format.type", WRONG_TYPE, _const(text_format)),
        Rule(4, "text.format.?", EXTRA, _key("text.format")),
        Rule(4, "text.format.type", ALL, _const(unsupported("text.format"))),
        Rule(4, "text.format", frozenset({"union_tag_not_found"}), _const(text_format)),
        Rule(4, "text.format", frozenset({"union_tag_invalid"}), _const(unsupported("text.format"))),
        Rule(5, "truncation", ALL, _typed(str, malformed("`truncation` must be a JSON string"), _truncation)),
        Rule(6, "instructions", ALL, _const(malformed("`instructions` must be a JSON string"))),
        Rule(7, "tool_choice", ALL, _tool_choice),
        Rule(7, "tool_choice.type", ALL, _choice_type),
    ]


def _input_rules() -> list[Rule]:
    """The input, item by item: messages and their parts, function calls and their outputs."""
    part_text = malformed("text content part requires a string `text`")
    bad_arguments = malformed("function_call requires `arguments` as a JSON object string")
    return [
        Rule(8, "input", ALL, _const(empty_input())),
        Rule(8, "input.*", WRONG_TYPE, _const(malformed("input items must be objects"))),
        Rule(8, "input.*.type", ALL, _item_type),
        Rule(8, "input.*.?", EXTRA, _key("message item"), MESSAGE),
        *_metadata("message item", MESSAGE, 8),
        Rule(8, "input.*.role", ALL, _typed(str, malformed("message item `role` must be a JSON string"),
                                            lambda f: malformed(f"unsupported role `{f.value}`")), MESSAGE),
        Rule(8, "input.*.content", frozenset({"missing"}), _const(malformed("message item requires `content`")),
             MESSAGE),
        Rule(8, "input.*.content", WRONG_TYPE, _const(malformed("message content must be a string or array")), MESSAGE),
        Rule(8, "input.*.content", ALL, _const(malformed("empty message content")), MESSAGE),
        Rule(8, "input.*.content.*", frozenset({"union_tag_invalid"}),
             lambda f: unsupported(f"content part `{f.value['type']}`") if isinstance(f.value.get("type"), str)
             else malformed("content parts must be typed objects"), MESSAGE),
        Rule(8, "input.*.content.*", ALL, _const(malformed("content parts must be typed objects")), MESSAGE),
        Rule(8, "input.*.content.*.?", EXTRA, _key("text content part"), "text"),
        Rule(8, "input.*.content.*.annotations", WRONG_TYPE,
             _const(malformed("text content part `annotations` must be a JSON array")), "text"),
        Rule(8, "input.*.content.*.annotations", ALL, _const(unsupported("text content part `annotations`")), "text"),
        Rule(8, "input.*.content.*.logprobs", WRONG_TYPE,
             _const(malformed("text content part `logprobs` must be a JSON array")), "text"),
        Rule(8, "input.*.content.*.logprobs", ALL, _const(unsupported("text content part `logprobs`")), "text"),
        Rule(8, "input.*.content.*.text", ALL, _const(part_text), "text"),
        Rule(8, "input.*.content.*.?", EXTRA, _key("input_image part"), "input_image"),
        Rule(8, "input.*.content.*.detail", ALL, _const(unsupported("input_image.detail")), "input_image"),
        Rule(8, "input.*.content.*.image_url", ALL, _const(malformed("input_image requires a valid image_url")),
             "input_image"),
        Rule(8, "input.*.?", EXTRA, _key("function_call item"), CALL),
        *_metadata("function_call item", CALL, 8),
        Rule(8, "input.*.call_id", ALL, _const(malformed("function_call item requires `call_id` and `name`")), CALL),
        Rule(8, "input.*.name", ALL, _const(malformed("function_call item requires `call_id` and `name`")), CALL),
        Rule(8, "input.*.arguments", ALL, _const(bad_arguments), CALL),
        Rule(8, "input.*.?", EXTRA, _key("function_call_output item"), OUTPUT),
        *_metadata("function_call_output item", OUTPUT, 8),
        Rule(8, "input.*.call_id", ALL, _const(malformed("function_call_output item requires `call_id`")), OUTPUT),
        Rule(8, "input.*.output", ALL, _const(malformed("function_call_output item requires a string `output`")),
             OUTPUT),
        Rule(8, "input.*.?", EXTRA, _key("reasoning item"), REASONING),
        *_metadata("reasoning item", REASONING, 8),
        *(Rule(8, pattern, ALL, _const(malformed("reasoning item `summary` must be an array of summary_text parts")),
               REASONING) for pattern in ("input.*.summary", "input.*.summary.*", "input.*.summary.*.?")),
        # content and encrypted_content may be null (an explicit null is not refused)
        *(Rule(8, pattern, NOT_NULL, _const(malformed("reasoning item `content` must be an array of reasoning_text "
                                                      "parts")), REASONING)
          for pattern in ("input.*.content", "input.*.content.*", "input.*.content.*.?")),
        Rule(8, "input.*.encrypted_content", NOT_NULL,
             _const(malformed("reasoning item `encrypted_content` must be a JSON string")), REASONING),
    ]


def _sampling_and_tool_rules() -> list[Rule]:
    return [
        # sampling: types first, then the ranges
        Rule(9, "max_output_tokens", WRONG_TYPE, _const(malformed("`max_output_tokens` must be a JSON integer"))),
        Rule(9, "max_output_tokens", frozenset({"multiple_of", "less_than_equal"}), _integer_range),
        Rule(9, "temperature", WRONG_TYPE, _const(_number("temperature"))),
        Rule(9, "top_p", WRONG_TYPE, _const(_number("top_p"))),
        Rule(9, "max_output_tokens", RANGE, _integer_range),
        Rule(9, "temperature", RANGE, _finite_range("temperature")),
        Rule(9, "top_p", RANGE, _finite_range("top_p")),
        # tools, one by one: the kind before the keys, so a hosted tool's fields never hide the reason
        Rule(10, "tools", WRONG_TYPE, _const(malformed("`tools` must be a JSON array"))),
        Rule(10, "tools.*", frozenset({"union_tag_invalid"}),
             lambda f: unsupported_tool(f.value["type"]) if isinstance(f.value.get("type"), str)
             else malformed("tool requires a string `type`")),
        Rule(10, "tools.*", frozenset({"union_tag_not_found"}), _const(malformed("tool requires a string `type`"))),
        Rule(10, "tools.*", ALL, _const(malformed("tools must be objects"))),
        Rule(10, "tools.*.?", EXTRA, _key("function tool"), "function"),
        Rule(10, "tools.*.name", ALL, _const(malformed("function tool requires a name")), "function"),
        Rule(10, "tools.*.strict", ALL, _typed(bool, _boolean("strict"), _const(unsupported("tools[].strict:true"))),
             "function"),
        Rule(10, "tools.*.description", frozenset({"string_type"}), _const(malformed("tool `description` must be a JSON string")),
             "function"),
        Rule(10, "tools.*.parameters", ALL, _const(malformed("tool `parameters` must be a JSON object")), "function"),
        Rule(10, "tools.*.?", EXTRA, _key("web_search tool"), "web_search"),
        Rule(10, "tools.*.external_web_access", frozenset({"missing"}), _const(unsupported_tool("web_search")),
             "web_search"),
        Rule(10, "tools.*.external_web_access", ALL,
             _typed(bool, _boolean("external_web_access"), _const(unsupported_tool("web_search"))), "web_search"),
        Rule(11, "stream", ALL, _const(_boolean("stream"))),
    ]


def _rules() -> list[Rule]:
    return [*_envelope_rules(), *_input_rules(), *_sampling_and_tool_rules()]


RULES = _rules()


def _worded(fault: Fault) -> tuple[tuple[Any, ...], ApiError] | None:
    for index, rule in enumerate(RULES):
        if rule.member not in (None, fault.member, fault.item) or not fault.matches(rule.pattern):
            continue
        if rule.kinds and fault.kind not in rule.kinds:
            continue
        error = rule.word(fault)
        if error is not None:
            return (rule.group, fault.indices, index, str(fault.path)), error
    return None


def first_error(faults: list[Fault]) -> ApiError:
    worded = [w for w in map(_worded, faults) if w is not None]
    if not worded:  # a shape the table does not name: still a clear 400
        return malformed("the request does not match the schema")
    return min(worded, key=lambda w: w[0])[1]


def _fault(error: Any) -> Fault:
    """A pydantic error with its union-member names taken out of the path and kept as `members`."""
    path: list[str | int] = []
    members: list[str] = []
    previous: Any = None
    for part in error["loc"]:
        if part in ITEM_MEMBERS:
            members.append(ITEM_MEMBERS[part])
        elif (isinstance(previous, int) or tuple(path) == ("text", "format")) and part in TAG_MEMBERS:
            members.append(TAG_MEMBERS[part])  # a discriminator tag: after an array index, or text.format's
        elif isinstance(part, str) and (part in _UNION_TAGS or "[" in part or part[:1].isupper()):
            pass  # a plain union's member: a generated RootModel's name or a pydantic type tag
        else:
            path.append(part)
        previous = part
    return Fault(tuple(path), error["type"], error.get("input"), tuple(members))


def _item_members(faults: list[Fault]) -> list[Fault]:
    """Keep, for each input item, only the errors of the member the item's `type` names.

    A member whose own `type` was refused is not the one the user meant; when every member refused it,
    the item's type itself is the error.
    """
    refused: dict[Any, set[str]] = {}
    for f in faults:
        if f.item and f.path[2:] == ("type",):
            refused.setdefault(f.path[1], set()).add(f.item)
    kept = []
    for f in faults:
        gone = refused.get(f.path[1], set()) if f.item else set()
        if f.item not in gone:
            kept.append(f)
        elif len(gone) == len(ITEM_MEMBERS) and f.item == MESSAGE and f.path[2:] == ("type",):
            kept.append(Fault(f.path, f.kind, f.value))
    return kept


def _specific(faults: list[Fault]) -> list[Fault]:
    """Drop a union's other-member mismatch (`input` is not a string) when another error explains more:
    one deeper in the same value, or a refused value at the same place."""

    def explained(f: Fault) -> bool:
        return any(g.path[:len(f.path)] == f.path and (
            len(g.path) > len(f.path) or (f.kind in WRONG_TYPE and g.kind not in WRONG_TYPE)) for g in faults)

    return [f for f in faults if not explained(f)]


def schema_error(exc: pydantic.ValidationError, _: Any = None) -> ApiError:
    faults = [_fault(e) for e in exc.errors(include_url=False)]
    return first_error(_specific(_item_members(faults)))


# -- explicit nulls --------------------------------------------------------------------------------

def _nulls(node: Any, path: tuple[str | int, ...], members: tuple[str, ...]) -> Iterator[Fault]:
    """Explicit nulls in a parsed model: the generated models read them as absent."""
    if isinstance(node, pydantic.RootModel):
        yield from _nulls(node.root, path, members)
    elif isinstance(node, pydantic.BaseModel):
        name = type(node).__name__
        if name in ITEM_MEMBERS:
            members = (*members, ITEM_MEMBERS[name])
        elif path and isinstance(path[-1], int) and str(getattr(node, "type", "")) in TAG_MEMBERS:
            members = (*members, TAG_MEMBERS[str(node.type)])
        for key in sorted(node.model_fields_set):
            value = getattr(node, key)
            if value is None:
                yield Fault((*path, key), "null", None, members)
            else:
                yield from _nulls(value, (*path, key), members)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _nulls(item, (*path, i), members)


def check_nulls(request: pydantic.BaseModel) -> None:
    faults = [f for f in _nulls(request, (), ()) if _worded(f) is not None]
    if faults:
        raise first_error(faults)


# -- the route's rules -------------------------------------------------------------------------------

def before_model(data: dict[str, Any]) -> None:
    # The route names a missing model before anything else, unknown fields included.
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise missing_model()
    # The generated models read 0 as `false` (Python's False == 0) where the schema allows only false.
    for name in ("store", "background"):
        if type(data.get(name, False)) in (int, float):
            raise malformed(f"`{name}` must be a JSON boolean")


# Every field the handler acts on or accepts with a local meaning; a field a spec change adds is
# refused until it is listed here.
FIELDS = frozenset({
    "model", "input", "instructions", "stream", "temperature", "top_p", "max_output_tokens", "tools",
    "tool_choice", "text", "truncation", "store", "background", "parallel_tool_calls", "client_metadata",
    "prompt_cache_key", "reasoning", "include", "top_logprobs",
})
ROUTE_RULES = RouteRules(bad_json=bad_json, not_object=not_object, before_model=before_model,
                         schema_error=schema_error, handled=FIELDS, unhandled=unsupported)
