"""The installed distribution's version, for `swama --version` and the served OpenAPI document."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    try:
        return version("swama")
    except PackageNotFoundError:  # a bare source tree that was never installed
        return "0+unknown"
