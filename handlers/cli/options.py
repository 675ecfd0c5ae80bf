"""Command-line flags made from the settings models: one flag per field, with the field's own help
text, default, environment variable, choices and bounds, so none of them is written twice.

Values are checked when the settings are read (`read`), for flags and environment variables alike,
and a bad one is refused in one line that names the flag.
"""

from __future__ import annotations

import argparse
import os
import types
from collections.abc import Iterable
from typing import Any, Union, get_args, get_origin

from pydantic_settings import BaseSettings

from swama.engine.client import env_of


def _value_type(annotation: Any) -> Any:
    """The type a flag's text converts to: the field's type without `| None`."""
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return annotation


def _default_text(info: Any, extra: dict[str, Any]) -> str:
    if extra.get("default_text"):
        return str(extra["default_text"])
    if info.default is None:
        return "none"
    return f"{info.default:g}" if isinstance(info.default, float) else str(info.default)


def _escaped(help: str) -> str:
    return help.replace("%", "%%")  # argparse formats help with %


def add_options(parser: argparse.ArgumentParser, cls: type[BaseSettings], *, only: Iterable[str] | None = None) -> None:
    """A flag for each command-line field of `cls` (or of those named in `only`). Flags not given stay
    out of the parsed arguments, so the environment and the defaults decide for them."""
    wanted = set(only) if only is not None else None
    for name, info in cls.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if not extra.get("cli", True) or (wanted is not None and name not in wanted):
            continue
        env = env_of(cls, name)
        kind = _value_type(info.annotation)
        if kind is bool:
            flags = extra.get("flags") or [f"--{'no-' if info.default else ''}{name.replace('_', '-')}"]
            parser.add_argument(*flags, dest=name, action="store_false" if info.default else "store_true",
                                default=argparse.SUPPRESS,
                                help=_escaped(f"{info.description} (env {env}={0 if info.default else 1})"))
            continue
        flags = extra.get("flags") or [f"--{name.replace('_', '-')}"]
        parser.add_argument(*flags, dest=name, type=kind, metavar=extra.get("metavar"),
                            choices=extra.get("choices") or None, default=argparse.SUPPRESS,
                            help=_escaped(f"{info.description} (default {_default_text(info, extra)}; env {env})"))


def given(args: argparse.Namespace, cls: type[BaseSettings]) -> dict[str, Any]:
    """The fields of `cls` that flags set on this command line."""
    return {name: getattr(args, name) for name in cls.model_fields if hasattr(args, name)}


def export(args: argparse.Namespace, cls: type[BaseSettings]) -> None:
    """Put the flags of `cls` into the environment: process-wide settings are read from there, also
    after the restart that preloads a BLAS."""
    for name, value in given(args, cls).items():
        os.environ[env_of(cls, name)] = str(value)


def options_table(*classes: type[BaseSettings]) -> str:
    """A markdown table of the command-line options of `classes`: flag, default, variable, meaning."""
    rows = [["option", "default", "environment", "what it does"], ["---"] * 4]
    seen: set[str] = set()
    for cls in classes:
        for name, info in cls.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if name in seen or not extra.get("cli", True):
                continue
            seen.add(name)
            env = env_of(cls, name)
            if _value_type(info.annotation) is bool:
                flag = (extra.get("flags") or [f"--{'no-' if info.default else ''}{name.replace('_', '-')}"])[0]
                rows.append([f"`{flag}`", "", f"`{env}={0 if info.default else 1}`", info.description])
                continue
            flags = extra.get("flags") or [f"--{name.replace('_', '-')}"]
            value = "|".join(extra["choices"]) if extra.get("choices") else extra.get("metavar") or "VALUE"
            flag = " ".join([f"`{flags[0]} {value}`", *(f"(also `{other}`)" for other in flags[1:])])
            rows.append([flag, _default_text(info, extra), f"`{env}`", info.description])
    return "".join("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |\n" for row in rows)
