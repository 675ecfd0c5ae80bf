"""Anthropic's Messages API as an OpenAPI document, read from the installed `anthropic` Python SDK.

Anthropic publishes no OpenAPI file to pin. Its Python SDK is generated from Anthropic's own
specification and carries it as types: request parameters are TypedDicts, answers pydantic models.
This module turns those types into JSON Schema with pydantic (`TypeAdapter.json_schemas`, one pass,
so every type has one name) and the `$defs` into components:

- `POST /v1/messages`: `MessageCreateParams`, the SDK's `MessageCreateParamsBase` plus `stream` as one
  boolean (the SDK's two TypedDicts, `...NonStreaming` with `stream: Literal[False]` and `...Streaming`
  with `stream: Required[Literal[True]]`, differ in nothing else; that is checked) -> `Message`, or
  server-sent events of `RawMessageStreamEvent` (the SDK reads `event: error` as an `ErrorResponse`);
- `POST /v1/messages/count_tokens`: `MessageCountTokensParams` -> `MessageTokensCount`;
- errors: `ErrorResponse` (shared/error_response.py), `{"type": "error", "error": {"type", "message"},
  "request_id"}`.

Reading the Python types, pydantic's way:
- `Required[X]` keys are required; other TypedDict keys optional; `Optional[X]` is `anyOf [X, null]`
  (the SDK states null where Anthropic's specification allows it); `Iterable[X]` and
  `SequenceNotStr[X]` are arrays; `Dict[str, object]` an open object;
- `Base64FileInput` (a path or file the SDK reads and encodes for the caller) is Python-side only:
  its `format: path` alternative is dropped, the wire carries the base64 string;
- the SDK's models allow extra keys (`extra="allow"`, a client's tolerance of newer answers), and
  TypedDicts say nothing of them: every object with properties is closed here
  (`additionalProperties: false`) unless the SDK opens it on purpose (`InputSchemaTyped`, an open
  JSON Schema; `Dict[str, object]`);
- unions whose members all carry a distinct constant `type` become discriminated `oneOf`s, as the
  SDK's `UnionDiscriminator("type")` says of its answer unions;
- `title`s (pydantic's class names) and descriptions (docstrings) are prose and go.

What swama serves of it is narrowed by specs/overlays/anthropic.yaml, not here.

The pin records the SDK version as upstream_commit and, as upstream_sha256, `types_sha256()`: the
sha256 of a `sha256sum`-style manifest of every `anthropic/types/**/*.py` file of the installed
package (one line `<sha256 of the file>  <path relative to site-packages>\\n` per file, sorted by
path), which is

    cd "$(python -c 'import anthropic, os; print(os.path.dirname(os.path.dirname(anthropic.__file__)))')"
    find anthropic/types -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum

and the same from the files of the anthropic-2.10.0 wheel. Each file is first checked against the
wheel's RECORD, so a locally edited SDK is refused rather than pinned.
"""

from __future__ import annotations

import copy
import typing
from typing import Any

from tools.spec.sdk_types import (
    REF,
    PinnedSdk,
    SdkMismatch,
    clean,
    close_objects,
    schemas_of,
    sort_enums,
)
from tools.spec.sources import ANTHROPIC

SDK = PinnedSdk("anthropic", ANTHROPIC.commit, ("anthropic/types",))  # the PyPI version is the pin's upstream_commit
# The SDK's own resource paths (resources/messages/messages.py posts to these).
CREATE_PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
check_version, types_sha256 = SDK.check_version, SDK.types_sha256
__all__ = ["SdkMismatch", "build_document", "check_version", "types_sha256"]


# -- reading the types ----------------------------------------------------------------------------


def _sdk_posts_to_our_paths() -> None:
    """The SDK's own resource still posts to the paths the document states."""
    source = SDK.read("anthropic/resources/messages/messages.py")
    for path in (CREATE_PATH, COUNT_PATH):
        if f'"{path}"' not in source:
            raise SdkMismatch(f"anthropic/resources/messages/messages.py no longer posts to {path}")


def _stream_is_the_only_difference() -> None:
    from typing import Literal, Required

    from anthropic.types import message_create_params as params

    def keys(td: Any) -> set[str]:
        return set(td.__required_keys__) | set(td.__optional_keys__)

    base = keys(params.MessageCreateParamsBase)
    expected = {params.MessageCreateParamsNonStreaming: Literal[False],
                params.MessageCreateParamsStreaming: Literal[True]}
    for variant, literal in expected.items():
        if keys(variant) - base != {"stream"}:
            raise SdkMismatch(f"{variant.__name__} adds {sorted(keys(variant) - base)} to the base params, "
                              "not `stream` alone: MessageCreateParams is no longer one schema plus a boolean")
        hint = typing.get_type_hints(variant, include_extras=True)["stream"]
        if typing.get_origin(hint) is Required:
            (hint,) = typing.get_args(hint)
        if hint != literal:
            raise SdkMismatch(f"{variant.__name__}.stream is {hint}, not {literal}")


def _sdk_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """(root schemas by our name, $defs) for every type the two operations reach."""
    from anthropic import _models
    from anthropic.types import (
        ErrorResponse,
        Message,
        MessageCountTokensParams,
        MessageTokensCount,
        RawMessageStreamEvent,
    )
    from anthropic.types.message_create_params import MessageCreateParamsBase

    roots = {
        "MessageCreateParams": MessageCreateParamsBase,
        "MessageCountTokensParams": MessageCountTokensParams,
        "Message": Message,
        "MessageTokensCount": MessageTokensCount,
        "RawMessageStreamEvent": RawMessageStreamEvent,
        "ErrorResponse": ErrorResponse,
    }
    return schemas_of(roots, _models.BaseModel)


def _const_tag(schemas: dict[str, Any], member: Any, prop: str) -> Any:
    if not isinstance(member, dict) or set(member) != {"$ref"}:
        return None
    target = schemas.get(member["$ref"].rsplit("/", 1)[-1], {})
    spec = target.get("properties", {}).get(prop, {})
    return spec.get("const") if prop in target.get("required", []) else None


def _discriminate(schemas: dict[str, Any], node: Any) -> None:
    """anyOf [$ref...] whose members all have a distinct constant, required `type` -> a discriminated oneOf."""
    if isinstance(node, dict):
        members = node.get("anyOf")
        if isinstance(members, list) and len(members) > 1 and "discriminator" not in node:
            tags = [_const_tag(schemas, m, "type") for m in members]
            if all(isinstance(t, str) for t in tags) and len(set(tags)) == len(tags):
                node["oneOf"] = node.pop("anyOf")
                node["discriminator"] = {"propertyName": "type"}
        for value in node.values():
            _discriminate(schemas, value)
    elif isinstance(node, list):
        for value in node:
            _discriminate(schemas, value)


# -- the document ---------------------------------------------------------------------------------


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(model=ref)}}}


def build_document() -> dict[str, Any]:
    """The upstream-shaped document (paths at the SDK's own resource paths, every reached type as a
    component); tools/spec/extract.py keeps the operations served and finishes it as for any upstream."""
    check_version()
    _sdk_posts_to_our_paths()
    _stream_is_the_only_difference()
    import anthropic

    roots, defs = _sdk_schemas()
    schemas = {**defs, **roots}
    schemas = clean(schemas, names=True)
    create = schemas["MessageCreateParams"]
    create["properties"]["stream"] = {"type": "boolean"}
    close_objects(schemas, names=True)
    sort_enums(schemas)
    _discriminate(schemas, schemas)
    stream = {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string"},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": [
                {"$ref": REF.format(model="RawMessageStreamEvent")}, {"$ref": REF.format(model="ErrorResponse")}]}},
        },
    }
    paths = {
        CREATE_PATH: {"post": {
            "operationId": "createMessage",
            "requestBody": {"required": True, "content": _json("MessageCreateParams")},
            "responses": {"200": {"content": {**_json("Message"), "text/event-stream": {"schema": stream}}}},
        }},
        COUNT_PATH: {"post": {
            "operationId": "countMessageTokens",
            "requestBody": {"required": True, "content": _json("MessageCountTokensParams")},
            "responses": {"200": {"content": _json("MessageTokensCount")}},
        }},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Anthropic Messages (anthropic Python SDK)", "version": anthropic.__version__},
        "paths": paths,
        "components": {"schemas": dict(sorted(copy.deepcopy(schemas).items()))},
    }
