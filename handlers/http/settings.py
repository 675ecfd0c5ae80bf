"""Server settings: command-line flags over environment variables over defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 28100
DEFAULT_CONTEXT_LIMIT = 16384


def default_models_root() -> Path:
    return Path(os.environ.get("SWAMA_MODELS") or Path.home() / ".swama" / "models").expanduser()


@dataclass
class Settings:
    host: str = field(default_factory=lambda: os.environ.get("SWAMA_HOST", DEFAULT_HOST))
    port: int = field(default_factory=lambda: int(os.environ.get("SWAMA_PORT", DEFAULT_PORT)))
    api_key: str | None = field(default_factory=lambda: os.environ.get("SWAMA_API_KEY") or None)
    models_root: Path = field(default_factory=default_models_root)
    context_limit: int = field(
        default_factory=lambda: int(os.environ.get("SWAMA_CONTEXT_LIMIT", DEFAULT_CONTEXT_LIMIT)))
    default_model: str | None = None  # the model `swama serve MODEL` was started with
    clef_model: str | None = None  # what @cf/cloudflare/clef and clef-flash mean (None: default_model)
    # A cap for generations that set no max_tokens / max_output_tokens (None: up to the context limit).
    default_max_tokens: int | None = field(
        default_factory=lambda: int(os.environ["SWAMA_MAX_TOKENS"]) if os.environ.get("SWAMA_MAX_TOKENS") else None)
    max_queue: int = field(default_factory=lambda: int(os.environ.get("SWAMA_MAX_QUEUE", 64)))
    max_model_queue: int = field(default_factory=lambda: int(os.environ.get("SWAMA_MAX_MODEL_QUEUE", 32)))
    queue_timeout: float = field(default_factory=lambda: float(os.environ.get("SWAMA_QUEUE_TIMEOUT", 600)))
    # Bytes of key/value cache kept per model for resuming prompts (0: off; SWAMA_PROMPT_CACHE=0 too).
    prompt_cache_bytes: int | None = field(default_factory=lambda: 0 if os.environ.get("SWAMA_PROMPT_CACHE") == "0"
                                           else int(os.environ["SWAMA_PROMPT_CACHE_BYTES"])
                                           if os.environ.get("SWAMA_PROMPT_CACHE_BYTES") else None)
    # Continuous batching of chat and responses: rows decoded together per model, the prefill chunk
    # interleaved with decode steps, and off (one request at a time per model, in arrival order).
    batch_rows: int = field(default_factory=lambda: int(os.environ.get("SWAMA_BATCH_ROWS", 16)))
    # None: the device's default (engine/serving/scheduler.py default_prefill_step).
    prefill_step: int | None = field(default_factory=lambda: int(os.environ["SWAMA_PREFILL_STEP"])
                                     if os.environ.get("SWAMA_PREFILL_STEP") else None)
    batching: bool = field(default_factory=lambda: os.environ.get("SWAMA_BATCHING", "1") != "0")
    # Bytes all loaded models may take (None: what the system has available); loads past it evict
    # idle models first, else answer 503.
    memory_limit: int | None = field(
        default_factory=lambda: int(os.environ["SWAMA_MEMORY_LIMIT"]) if os.environ.get("SWAMA_MEMORY_LIMIT") else None)
    # The browser playground at / and /ui/ (--no-ui or SWAMA_UI=0: off, those paths answer 404).
    ui: bool = field(default_factory=lambda: os.environ.get("SWAMA_UI", "1") != "0")
    idle_seconds: float = field(default_factory=lambda: float(os.environ.get("SWAMA_IDLE_SECONDS", 300)))
    # Decisions share one prefill of the common prefix across questions; off = a fresh cache each.
    decision_prefix_reuse: bool = field(
        default_factory=lambda: os.environ.get("SWAMA_DECISION_PREFIX_CACHE", "1") != "0")
