"""What the documents built from a vendor's Python SDK share (anthropic_sdk.py, cohere_sdk.py): the
pin on the installed package, JSON Schema from its types with pydantic, and the clean-up that turns
Python-side schemas into wire schemas.

The pin is the package's PyPI version and the sha256 of a `sha256sum`-style manifest of the files the
document is read from (one line `<sha256 of the file>  <path relative to site-packages>\\n` per
`.py` file, sorted by path), each file first checked against the wheel's RECORD, so a locally edited
SDK is refused rather than pinned.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from importlib import import_module, metadata
from pathlib import Path
from typing import Any

REF = "#/components/schemas/{model}"
# Schema keywords whose children are names (property names, component names), not keywords.
_NAME_MAPS = {"properties", "patternProperties", "$defs", "schemas", "dependentSchemas"}


class SdkMismatch(RuntimeError):
    pass


@dataclass(frozen=True)
class PinnedSdk:
    package: str  # the import and distribution name
    version: str  # the pinned PyPI version
    sources: tuple[str, ...]  # folders (their .py files, recursively) and files, relative to site-packages

    def check_version(self) -> None:
        """Refuse to read any SDK but the pinned one: the document would silently follow it."""
        try:
            module = import_module(self.package)
        except ImportError:
            raise SdkMismatch(f"the {self.package} SDK is not installed: "
                              f"pip install {self.package}=={self.version}") from None
        installed = getattr(module, "__version__", None) or metadata.version(self.package)
        if installed != self.version:
            raise SdkMismatch(f"{self.package} {installed} is installed; the document is pinned to {self.version}: "
                              f"pip install {self.package}=={self.version} (or bump the pinned version)")

    def site_packages(self) -> Path:
        return Path(import_module(self.package).__file__).resolve().parent.parent

    def read(self, rel: str) -> str:
        return (self.site_packages() / rel).read_text(encoding="utf-8")

    def _files(self) -> list[tuple[str, bytes]]:
        root = self.site_packages()
        paths = set()
        for rel in self.sources:
            where = root / rel
            paths.update(where.rglob("*.py") if where.is_dir() else [where])
        return [(rel, path.read_bytes()) for rel, path in sorted((p.relative_to(root).as_posix(), p) for p in paths)]

    def _check_record(self, files: list[tuple[str, bytes]]) -> None:
        """Every source file is the wheel's own: its sha256 matches the distribution's RECORD."""
        recorded = {}
        for entry in metadata.distribution(self.package).files or []:
            if entry.hash is not None and entry.hash.mode == "sha256":
                recorded[entry.as_posix()] = entry.hash.value
        for rel, data in files:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if recorded.get(rel) != digest:
                raise SdkMismatch(f"{rel} differs from the {self.package} {self.version} wheel's RECORD (edited, or "
                                  f"not from the wheel): pip install --force-reinstall {self.package}=={self.version}")

    def types_sha256(self) -> str:
        """The digest pinned as upstream_sha256 (see the module docstring)."""
        self.check_version()
        files = self._files()
        self._check_record(files)
        manifest = "".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in files)
        return hashlib.sha256(manifest.encode()).hexdigest()


def schemas_of(roots: dict[str, Any], open_base: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """(root schemas by our name, $defs) for the types `roots` names and every type they reach, in one
    pydantic pass so each type has one name. `open_base`: the SDK's model base class, whose
    `extra="allow"` is the client's tolerance of newer answers, not the API's statement of them."""
    import pydantic
    from pydantic.json_schema import GenerateJsonSchema

    class Generate(GenerateJsonSchema):
        def model_schema(self, schema: Any) -> Any:
            json_schema = super().model_schema(schema)
            if issubclass(schema["cls"], open_base) and json_schema.get("additionalProperties") is True:
                del json_schema["additionalProperties"]
            return json_schema

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
            rename_refs(defs, target, name)
            rename_refs(out, target, name)
        elif ref:
            out[name] = defs.pop(target)
        else:
            out[name] = schema  # a union alias: its own component
    if clash := sorted(set(out) & set(defs)):
        raise SdkMismatch(f"the SDK names types as the roots are named: {clash}")
    return out, defs


def rename_refs(node: Any, old: str, new: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and value == REF.format(model=old):
                node[key] = REF.format(model=new)
            else:
                rename_refs(value, old, new)
    elif isinstance(node, list):
        for value in node:
            rename_refs(value, old, new)

# -- from Python types to wire schemas ------------------------------------------------------------

_PATH_INPUT = {"format": "path", "type": "string"}  # Base64FileInput: a file the SDK reads for its caller


def clean(node: Any, names: bool = False) -> Any:
    """Drop titles and descriptions, and the Python-only path alternative of a base64 string."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if not names and key in ("title", "description"):
                continue
            out[key] = clean(value, names=(not names and key in _NAME_MAPS))
        if not names and isinstance(out.get("anyOf"), list) and _PATH_INPUT in out["anyOf"]:
            rest = [v for v in out["anyOf"] if v != _PATH_INPUT]
            del out["anyOf"]
            out.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
        return out
    if isinstance(node, list):
        return [clean(v) for v in node]
    return node


def close_objects(node: Any, names: bool = False) -> None:
    """An object with properties takes no others, unless the SDK said it does."""
    if isinstance(node, dict):
        if not names and isinstance(node.get("properties"), dict) and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key, value in node.items():
            close_objects(value, names=(not names and key in _NAME_MAPS))
    elif isinstance(node, list):
        for value in node:
            close_objects(value)


def sort_enums(node: Any) -> None:
    """Enums in a fixed order: typing caches `Literal[...]` by its set of values, so the order pydantic
    writes depends on which module spelled an equal Literal first, that is on import order."""
    if isinstance(node, dict):
        if isinstance(node.get("enum"), list) and all(isinstance(v, str) for v in node["enum"]):
            node["enum"] = sorted(node["enum"])
        for value in node.values():
            sort_enums(value)
    elif isinstance(node, list):
        for value in node:
            sort_enums(value)
