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

import base64
import copy
import hashlib
import typing
from importlib import metadata
from pathlib import Path
from typing import Any

from tools.spec.sources import ANTHROPIC

PINNED_VERSION = ANTHROPIC.commit  # the PyPI version is the pin's upstream_commit
PACKAGE = "anthropic"
TYPES_DIR = "anthropic/types"
# The SDK's own resource paths (resources/messages/messages.py posts to these).
CREATE_PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"

REF = "#/components/schemas/{model}"
# Schema keywords whose children are names (property names, component names), not keywords.
_NAME_MAPS = {"properties", "patternProperties", "$defs", "schemas", "dependentSchemas"}


class SdkMismatch(RuntimeError):
    pass


def check_version() -> None:
    """Refuse to read any SDK but the pinned one: the document would silently follow it."""
    try:
        import anthropic
    except ImportError:
        raise SdkMismatch(f"the anthropic SDK is not installed: pip install anthropic=={PINNED_VERSION}") from None
    if anthropic.__version__ != PINNED_VERSION:
        raise SdkMismatch(f"anthropic {anthropic.__version__} is installed; the Messages document is pinned to "
                          f"{PINNED_VERSION}: pip install anthropic=={PINNED_VERSION} (or bump PINNED_VERSION)")


def _site_packages() -> Path:
    import anthropic

    return Path(anthropic.__file__).resolve().parent.parent


def _type_files() -> list[tuple[str, bytes]]:
    root = _site_packages()
    files = sorted((p.relative_to(root).as_posix(), p) for p in (root / TYPES_DIR).rglob("*.py"))
    return [(rel, path.read_bytes()) for rel, path in files]


def _check_record(files: list[tuple[str, bytes]]) -> None:
    """Every type module is the wheel's own: its sha256 matches the distribution's RECORD."""
    recorded = {}
    for entry in metadata.distribution(PACKAGE).files or []:
        if entry.hash is not None and entry.hash.mode == "sha256":
            recorded[entry.as_posix()] = entry.hash.value
    for rel, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if recorded.get(rel) != digest:
            raise SdkMismatch(f"{rel} differs from the anthropic {PINNED_VERSION} wheel's RECORD (edited, or not "
                              f"from the wheel): pip install --force-reinstall anthropic=={PINNED_VERSION}")


def types_sha256() -> str:
    """The digest pinned as upstream_sha256 (see the module docstring)."""
    check_version()
    files = _type_files()
    _check_record(files)
    manifest = "".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in files)
    return hashlib.sha256(manifest.encode()).hexdigest()


# -- reading the types ----------------------------------------------------------------------------


def _sdk_posts_to_our_paths() -> None:
    """The SDK's own resource still posts to the paths the document states."""
    source = (_site_packages() / "anthropic/resources/messages/messages.py").read_text(encoding="utf-8")
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
    import pydantic
    from anthropic import _models
    from anthropic.types import (
        ErrorResponse,
        Message,
        MessageCountTokensParams,
        MessageTokensCount,
        RawMessageStreamEvent,
    )
    from anthropic.types.message_create_params import MessageCreateParamsBase
    from pydantic.json_schema import GenerateJsonSchema

    class Generate(GenerateJsonSchema):
        def model_schema(self, schema: Any) -> Any:
            json_schema = super().model_schema(schema)
            # extra="allow" on every SDK model is the client's tolerance of newer answers, not the API's
            # statement of them.
            if issubclass(schema["cls"], _models.BaseModel) and json_schema.get("additionalProperties") is True:
                del json_schema["additionalProperties"]
            return json_schema

    roots = {
        "MessageCreateParams": MessageCreateParamsBase,
        "MessageCountTokensParams": MessageCountTokensParams,
        "Message": Message,
        "MessageTokensCount": MessageTokensCount,
        "RawMessageStreamEvent": RawMessageStreamEvent,
        "ErrorResponse": ErrorResponse,
    }
    adapters = [(name, "validation", pydantic.TypeAdapter(t)) for name, t in roots.items()]
    by_key, defs = pydantic.TypeAdapter.json_schemas(adapters, ref_template=REF, schema_generator=Generate)
    defs = dict(defs.get("$defs", {}))
    out: dict[str, Any] = {}
    for (name, _), schema in by_key.items():
        ref = schema.get("$ref", "")
        target = ref.rsplit("/", 1)[-1]
        if ref and target != name:
            # A named type: the component takes our name (MessageCreateParamsBase -> MessageCreateParams).
            if target in roots and roots[target] is not roots[name]:
                raise SdkMismatch(f"component {target} is both a root and a type")
            out[name] = defs.pop(target)
            _rename_refs(defs, target, name)
            _rename_refs(out, target, name)
        elif ref:
            out[name] = defs.pop(target)
        else:
            out[name] = schema  # a union alias (RawMessageStreamEvent): its own component
    if clash := sorted(set(out) & set(defs)):
        raise SdkMismatch(f"the SDK names types as the roots are named: {clash}")
    return out, defs


def _rename_refs(node: Any, old: str, new: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and value == REF.format(model=old):
                node[key] = REF.format(model=new)
            else:
                _rename_refs(value, old, new)
    elif isinstance(node, list):
        for value in node:
            _rename_refs(value, old, new)


# -- from Python types to wire schemas ------------------------------------------------------------

_PATH_INPUT = {"format": "path", "type": "string"}  # Base64FileInput: a file the SDK reads for its caller


def _clean(node: Any, names: bool = False) -> Any:
    """Drop titles and descriptions, and the Python-only path alternative of a base64 string."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if not names and key in ("title", "description"):
                continue
            out[key] = _clean(value, names=(not names and key in _NAME_MAPS))
        if not names and isinstance(out.get("anyOf"), list) and _PATH_INPUT in out["anyOf"]:
            rest = [v for v in out["anyOf"] if v != _PATH_INPUT]
            del out["anyOf"]
            out.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
        return out
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


def _close_objects(node: Any, names: bool = False) -> None:
    """An object with properties takes no others, unless the SDK said it does."""
    if isinstance(node, dict):
        if not names and isinstance(node.get("properties"), dict) and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key, value in node.items():
            _close_objects(value, names=(not names and key in _NAME_MAPS))
    elif isinstance(node, list):
        for value in node:
            _close_objects(value)


def _sort_enums(node: Any) -> None:
    """Enums in a fixed order: typing caches `Literal[...]` by its set of values, so the order pydantic
    writes depends on which module spelled an equal Literal first, that is on import order."""
    if isinstance(node, dict):
        if isinstance(node.get("enum"), list) and all(isinstance(v, str) for v in node["enum"]):
            node["enum"] = sorted(node["enum"])
        for value in node.values():
            _sort_enums(value)
    elif isinstance(node, list):
        for value in node:
            _sort_enums(value)


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
    schemas = _clean(schemas, names=True)
    create = schemas["MessageCreateParams"]
    create["properties"]["stream"] = {"type": "boolean"}
    _close_objects(schemas, names=True)
    _sort_enums(schemas)
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
