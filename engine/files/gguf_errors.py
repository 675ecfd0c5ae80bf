"""The error raised when a GGUF file cannot be imported."""

from __future__ import annotations


class GGUFImportError(ValueError):
    """The GGUF file cannot be converted (unsupported content or a damaged file)."""
