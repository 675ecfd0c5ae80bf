"""Cohere's rerank routes as an OpenAPI document, read from the installed `cohere` Python SDK.

Cohere's SDK is generated (by Fern) from Cohere's own API definition. Its answers are pydantic
models; its requests have no types, only the parameters of the methods that send them, so each
request body is the model of one method's keyword parameters (`pydantic.create_model` from
`typing.get_type_hints`), named as the SDK names the answer:

- `POST /v1/rerank`: `BaseCohere.rerank` (raw_base_client.py posts to "v1/rerank") -> `RerankResponse`;
- `POST /v2/rerank`: `V2Client.rerank` (v2/raw_client.py posts to "v2/rerank") -> `V2RerankResponse`.

A parameter without a default is required; one whose default is the SDK's OMIT is optional, and its
`Optional[X]` states that the SDK sends an explicit None as null. `request_options` is the client's
own (retries, timeouts) and never on the wire. The SDK has no type for an error's body: Cohere answers
`{"message": "..."}`, stated here as `Error`. The clean-up is the anthropic document's
(sdk_types.py): no titles or descriptions, objects closed unless the SDK opens them on purpose
(v1's document objects, `Dict[str, str]`), enums in a fixed order.

The pin records the SDK version as upstream_commit and, as upstream_sha256, the sha256 of the
manifest of the files the document is read from (`SDK.sources`), checked against the wheel's RECORD.
"""

from __future__ import annotations

import copy
import inspect
import typing
from typing import Any

from tools.spec.sdk_types import REF, PinnedSdk, SdkMismatch, clean, close_objects, schemas_of, sort_enums
from tools.spec.sources import COHERE

SDK = PinnedSdk("cohere", COHERE.commit, ("cohere/types", "cohere/v2/types", "cohere/base_client.py",
                                          "cohere/v2/client.py", "cohere/raw_base_client.py",
                                          "cohere/v2/raw_client.py"))
V1_PATH, V2_PATH = "/v1/rerank", "/v2/rerank"
check_version, types_sha256 = SDK.check_version, SDK.types_sha256
__all__ = ["SdkMismatch", "build_document", "check_version", "types_sha256"]
ERROR = {"type": "object", "required": ["message"], "properties": {"message": {"type": "string"}}}


def _sdk_posts_to_our_paths() -> None:
    for rel, path in (("cohere/raw_base_client.py", V1_PATH), ("cohere/v2/raw_client.py", V2_PATH)):
        if f'"{path.lstrip("/")}"' not in SDK.read(rel):
            raise SdkMismatch(f"{rel} no longer posts to {path}")


def _request_model(name: str, method: Any) -> Any:
    """The body `method` sends: its keyword parameters as one model."""
    import pydantic

    hints = typing.get_type_hints(method)
    fields: dict[str, Any] = {}
    for param in inspect.signature(method).parameters.values():
        if param.name in ("self", "request_options"):
            continue
        if param.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise SdkMismatch(f"{method.__qualname__}({param.name}) is not a keyword parameter")
        required = param.default is inspect.Parameter.empty
        if not required and param.default is not Ellipsis:  # the SDK's OMIT
            raise SdkMismatch(f"{method.__qualname__}({param.name}) defaults to {param.default!r}, not OMIT")
        fields[param.name] = (hints[param.name], ... if required else None)
    return pydantic.create_model(name, __config__=pydantic.ConfigDict(extra="forbid"), **fields)


def _drop_null_defaults(node: Any) -> None:
    """`default: null` is pydantic's way of saying optional, which `required` already says."""
    if isinstance(node, dict):
        if node.get("default", 0) is None:
            del node["default"]
        for value in node.values():
            _drop_null_defaults(value)
    elif isinstance(node, list):
        for value in node:
            _drop_null_defaults(value)


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(model=ref)}}}


def build_document() -> dict[str, Any]:
    """The upstream-shaped document (paths at the SDK's own paths, every reached type a component);
    tools/spec/extract.py finishes it as for any upstream."""
    check_version()
    _sdk_posts_to_our_paths()
    import cohere
    from cohere.base_client import BaseCohere
    from cohere.core.pydantic_utilities import UniversalBaseModel
    from cohere.types import RerankResponse
    from cohere.v2.client import V2Client
    from cohere.v2.types import V2RerankResponse

    roots = {
        "RerankRequest": _request_model("RerankRequest", BaseCohere.rerank),
        "V2RerankRequest": _request_model("V2RerankRequest", V2Client.rerank),
        "RerankResponse": RerankResponse,
        "V2RerankResponse": V2RerankResponse,
    }
    out, defs = schemas_of(roots, UniversalBaseModel)
    schemas = clean({**defs, **out, "Error": ERROR}, names=True)
    _drop_null_defaults(schemas)
    close_objects(schemas, names=True)
    sort_enums(schemas)
    paths = {
        V1_PATH: {"post": {"operationId": "rerank", "requestBody": {"required": True, "content": _json("RerankRequest")},
                           "responses": {"200": {"content": _json("RerankResponse")}}}},
        V2_PATH: {"post": {"operationId": "rerankV2",
                           "requestBody": {"required": True, "content": _json("V2RerankRequest")},
                           "responses": {"200": {"content": _json("V2RerankResponse")}}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Cohere Rerank (cohere Python SDK)", "version": cohere.__version__},
        "paths": paths,
        "components": {"schemas": dict(sorted(copy.deepcopy(schemas).items()))},
    }
