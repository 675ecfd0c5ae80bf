"""Every engine option, once: its default, its environment variable, its help text and its bounds.

`EngineSettings` is what the engine runs with; the server extends it with its own options
(handlers/http/settings.py `ServerSettings`), and the `swama` command line makes its flags from the
fields (handlers/cli/options.py), so no default, variable name or help text is written anywhere else.
`RuntimeSettings` are the process-wide choices read before MLX starts (device, dtype, BLAS); they
live in the environment, because the BLAS preload restarts the process.

Values come from keyword arguments (the command line's flags), then `SWAMA_*` environment
variables, then the defaults below. `read()` turns a value out of bounds into one readable line
naming the flag (`--batch-rows must be at least 1 (got 0)`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import pydantic
from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from swama.engine.errors import EngineError

PREFIX = "SWAMA_"
# Prompt tokens read per scheduler step, by device: a CPU's other rows wait for the chunk; a GPU
# sits idle between small launches (an H200 read 34k tok/s in 512-token chunks against 145k tok/s
# in one 4096-token chunk, Qwen3-0.6B shape).
CPU_PREFILL_STEP = 512
GPU_PREFILL_STEP = 4096
# Decode steps a new prompt may wait, while rows generate, for more prompts to be read in the same
# forward, by device: on a GPU a forward over one short prompt costs about what one over sixteen
# does (the host launching its operations sets the time); on the CPU the arithmetic does, and a
# wait only delays the first token.
CPU_PREFILL_WAIT = 0
GPU_PREFILL_WAIT = 4
# The prompt cache, when --prompt-cache-bytes is not given: this fraction of physical memory, at most
# PROMPT_CACHE_CAP bytes.
PROMPT_CACHE_FRACTION = 0.10
PROMPT_CACHE_CAP = 4 << 30
PROMPT_DISK_BYTES = 8 << 30  # the prompt cache's disk tier, per model
DEVICE_CHOICES = ("auto", "gpu", "cpu")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
BLAS_CHOICES = ("auto", "openblas", "mkl", "bundled")
SPECULATIVE_MODES = ("off", "ngram", "draft", "auto")
COMPILED_STEP_MODES = ("auto", "on", "off")


def option(default: Any = None, help: str = "", *, env: str | None = None, flags: tuple[str, ...] = (),
           metavar: str | None = None, choices: tuple[str, ...] = (), default_text: str | None = None,
           cli: bool = True, **bounds: Any) -> Any:
    """A settings field with what the command line needs to offer it as a flag.

    `env` names the environment variable when it is not SWAMA_<FIELD>; `flags` the flag names when
    they are not --<field-name> (a boolean that defaults to true is offered as --no-<name>);
    `default_text` words a default that is computed; `cli=False` keeps a field off the command line.
    """
    extra = {"flags": list(flags), "metavar": metavar, "choices": list(choices), "default_text": default_text,
             "cli": cli}
    kwargs: dict[str, Any] = {"description": help, "json_schema_extra": extra, **bounds}
    if env is not None:
        kwargs["validation_alias"] = AliasChoices(env)
    if callable(default):
        return Field(default_factory=default, **kwargs)
    return Field(default, **kwargs)


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore",
                                      validate_by_name=True, validate_default=False)


def _models_home() -> Path:
    return Path.home() / ".swama" / "models"


class StoreSettings(_Settings):
    """Where the installed models live: all that `swama pull`, `list` and `rm` need."""

    models_root: Path = option(_models_home, "where installed models live", env="SWAMA_MODELS",
                               flags=("--models",), metavar="DIR", default_text="~/.swama/models")


class EngineSettings(StoreSettings):
    context_limit: int = option(16384, "default context limit in tokens", flags=("--context-limit", "--num-ctx"),
                                metavar="TOKENS", ge=1)
    default_max_tokens: int | None = option(
        None, "cap for generations that ask for no limit", env="SWAMA_MAX_TOKENS", flags=("--max-tokens",),
        metavar="TOKENS", default_text="the context limit", ge=1)
    grammar_compile_seconds: float = option(
        10.0, "the longest a structured output's schema or strict tools may take to compile; past it the request is "
              "refused (compiles run two at a time, beside the model's work)", metavar="SECONDS", gt=0, le=600)
    max_queue: int = option(64, "requests that may wait across all models before new ones get 429 with "
                                "Retry-After", metavar="N", ge=0)
    max_model_queue: int = option(32, "requests that may wait for one model before new ones get 429",
                                  metavar="N", ge=0)
    queue_timeout: float = option(600.0, "how long a request may wait for its model before it gets 503",
                                  metavar="SECONDS", gt=0)
    max_concurrent: int = option(3, "operations that run at once across all models when they take a model "
                                    "exclusively (loads, vision, embeddings, audio)", metavar="N", ge=1)
    idle_seconds: float = option(300.0, "a model unused this long is unloaded and its memory released",
                                 metavar="SECONDS", gt=0)
    memory_limit: int | None = option(
        None, "memory all loaded models may take, with the key/value state of their batches: a load past it evicts "
              "idle models first and otherwise gets 503; a request whose rows would pass it waits for room",
        metavar="BYTES", default_text="what the system has available", ge=1)
    prompt_cache: bool = option(True, "keep no prompt cache: every request prefills its whole prompt",
                                flags=("--no-prompt-cache",))
    prompt_cache_bytes: int | None = option(
        None, "key/value cache kept per model so a conversation's next turn resumes its prompt instead of "
              "prefilling it again (0 turns it off)", metavar="BYTES",
        default_text=f"{PROMPT_CACHE_FRACTION:.0%} of memory, at most {PROMPT_CACHE_CAP >> 30} GiB", ge=0)
    data_root: Path | None = option(
        None, "where files, batch jobs and the prompt cache's disk tier live; they outlive the server",
        env="SWAMA_DATA", flags=("--data",), metavar="DIR", default_text="'data' beside the model store")
    prompt_cache_dir: Path | None = option(
        None, "where the prompt cache keeps key/value blocks on disk, so prompts resume across restarts, "
              "unloads and evictions (a folder per model)", metavar="DIR", default_text="DATA/prompt-cache")
    prompt_cache_disk_bytes: int = option(
        PROMPT_DISK_BYTES, "disk the prompt cache's blocks may take per model; the least recently used go "
                           "first (0 keeps no blocks on disk)", metavar="BYTES", ge=0,
        default_text=f"{PROMPT_DISK_BYTES >> 30} GiB")
    kv_bits: int | None = option(
        None, "keep language models' key/value caches quantized to this many bits (8 or 4): with the default "
              "group size 3.2x (float32) or 1.8x (bfloat16) more tokens in the same memory at 8 bits, 5.3x or 3.2x "
              "at 4, in the batch, the prompt cache and its disk tier; --memory-limit admits rows by the quantized "
              "bytes (docs/benchmarks.md: what it costs in quality and speed)",
        metavar="BITS", default_text="off: full precision")
    kv_group_size: int = option(32, "values that share one scale and bias in a quantized key/value cache (32, 64 "
                                    "or 128; it must divide the model's head size): larger saves a little memory "
                                    "and costs accuracy, most at 4 bits", metavar="N")
    kv_quantize_after: int = option(0, "tokens a key/value cache holds at full precision before it is quantized "
                                       "(with --kv-bits); a batch is quantized whole once one of its caches is",
                                    metavar="TOKENS", ge=0)
    engine_process: bool = option(
        True, "run the server's engine in the server's own process instead of one of its own (where the loop "
              "that drives the device shares no interpreter lock with HTTP, templates and text work, and a "
              "crash of it ends the requests in flight with a 503 and restarts it)", flags=("--no-engine-process",))
    batching: bool = option(True, "serve one request at a time per model, in arrival order, instead of "
                                  "batching them continuously", flags=("--no-batching",))
    batch_rows: int = option(16, "requests one model generates for together, continuously batched: new ones "
                                 "join and finished ones leave between steps", metavar="N", ge=1)
    prefill_step: int | None = option(
        None, "prompt tokens read per step while other requests decode, so a long prompt does not stall the "
              "streams already running", metavar="TOKENS",
        default_text=f"{CPU_PREFILL_STEP} on the CPU, {GPU_PREFILL_STEP} on a GPU", ge=1)
    prefill_wait: int | None = option(
        None, "decode steps a new prompt may wait, while other requests generate, for more prompts to read in "
              "the same prefill forward (fewer forwards when requests arrive one by one)", metavar="STEPS",
        default_text=f"{CPU_PREFILL_WAIT} on the CPU, {GPU_PREFILL_WAIT} on a GPU", ge=0)
    speculative: str = option(
        "auto", "drafting in the batch: 'ngram' verifies continuations copied from the request's own text "
                "(prompt lookup) whenever one is found, 'draft' the tokens --draft-model proposes, 'auto' both "
                "(the draft model where lookup finds nothing) only while a row's acceptance pays for the wider "
                "pass, on the CPU (on a GPU auto is off: measured slower there), 'off' decodes one token per step", choices=SPECULATIVE_MODES, metavar="MODE")
    compiled_step: str = option(
        "auto", "the batch's decode step for qwen3, qwen2, llama and qwen3_5 models: 'on' runs one traced, compiled step "
                "over fixed-capacity key/value storage with fused projections, 'off' mlx-lm's forward, 'auto' the "
                "compiled step on a GPU (where launching operations, not arithmetic, sets a step's time) and "
                "mlx-lm's forward on the CPU", choices=COMPILED_STEP_MODES, metavar="MODE")
    draft_tokens: int = option(8, "most tokens a row drafts for one speculative step", metavar="N", ge=1, le=32)
    draft_model: str | None = option(
        None, "a smaller installed model with the same tokenizer that drafts tokens for the served language "
              "models to verify (--speculative draft or auto)", metavar="NAME")
    max_adapters: int = option(
        8, "LoRA adapters (`swama create DIR --base MODEL`) each base model keeps loaded at once; the least "
           "recently used one no request is using is unloaded when another is needed", metavar="N", ge=1, le=64)
    decision_prefix_reuse: bool = option(
        True, "score every decision question from a fresh cache (bit-exact repeats of single questions) "
              "instead of sharing one prefill of the common prefix", env="SWAMA_DECISION_PREFIX_CACHE",
        flags=("--no-decision-prefix-cache",))
    profile_dir: Path | None = option(
        None, "write a cProfile taken on each model's scheduler thread (the one thread that drives the device; "
              "from Python 3.12 it records every thread) into this folder when the model unloads or the server "
              "stops, for `python -m pstats`",
        metavar="DIR")

    @field_validator("profile_dir")
    @classmethod
    def _profile_dir(cls, value: Path | None) -> Path | None:
        """Refused at start, not when the first profile is written: the folder (or the nearest
        folder above it that exists, where it will be made) must be a writable folder."""
        if value is None:
            return None
        value = value.expanduser()
        existing = next(p for p in (value, *value.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"cannot write profiles into {str(value)!r}: {str(existing)!r} is not a writable folder")
        return value

    @field_validator("compiled_step")
    @classmethod
    def _compiled_step(cls, value: str) -> str:
        return _one_of("--compiled-step mode", COMPILED_STEP_MODES, value)

    @field_validator("kv_bits")
    @classmethod
    def _kv_bits(cls, value: int | None) -> int | None:
        if value is not None and value not in (4, 8):
            raise ValueError(f"--kv-bits must be 8 or 4 (got {value})")
        return value

    @field_validator("kv_group_size")
    @classmethod
    def _kv_group_size(cls, value: int) -> int:
        if value not in (32, 64, 128):
            raise ValueError(f"--kv-group-size must be 32, 64 or 128 (got {value})")
        return value

    def kv_quant(self) -> Any:
        """The key/value quantization in force (engine/text/kv_quant.py KVQuant), None without --kv-bits."""
        if self.kv_bits is None:
            return None
        from swama.engine.text.kv_policy import KVQuant

        return KVQuant(self.kv_bits, self.kv_group_size, self.kv_quantize_after)

    @model_validator(mode="after")
    def _draft_needs_a_model(self) -> EngineSettings:
        if self.speculative == "draft" and not self.draft_model:
            raise ValueError("--speculative draft needs --draft-model NAME (a smaller model with the same tokenizer)")
        return self

    @property
    def data_dir(self) -> Path:
        """Where files, batch jobs and the prompt cache's blocks live: --data, else `data` beside the model store."""
        return (self.data_root or self.models_root.expanduser().parent / "data").expanduser()

    def prompt_disk_dir(self) -> Path | None:
        """The prompt cache's disk tier, None when it is off (no prompt cache, or no disk budget)."""
        if self.prompt_cache_budget() == 0 or self.prompt_cache_disk_bytes == 0:
            return None
        return (self.prompt_cache_dir or self.data_dir / "prompt-cache").expanduser()

    def prompt_cache_budget(self) -> int:
        """Bytes of prompt cache per model (0: none)."""
        if not self.prompt_cache:
            return 0
        if self.prompt_cache_bytes is not None:
            return self.prompt_cache_bytes
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return 1 << 30
        return int(min(PROMPT_CACHE_CAP, total * PROMPT_CACHE_FRACTION))


def _one_of(kind: str, choices: tuple[str, ...], value: str) -> str:
    value = value.strip().lower()
    if value not in choices:
        raise ValueError(f"unknown {kind} {value!r}: choose one of {', '.join(choices)}")
    return value


class RuntimeSettings(_Settings):
    device: str = option("", "where models compute: the GPU when MLX's GPU build has one, else the CPU",
                         choices=DEVICE_CHOICES, default_text="auto")
    backend: str = option("", "the MLX build installed (cuda or cpu): picks the device when --device is not "
                              "given", cli=False)
    dtype: str = option("auto", "dtype floating weights are cast to at load: bfloat16 on a GPU, float32 on the "
                                "CPU, its fastest there", choices=DTYPE_CHOICES)
    blas: str = option("auto", "the BLAS preloaded for MLX's CPU backend: MKL's wheel when installed, else the "
                               "system OpenBLAS", choices=BLAS_CHOICES, cli=False)
    openblas: bool = option(True, "restart once with a tuned BLAS preloaded (Linux, CPU backend)", cli=False)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return _one_of("device", DEVICE_CHOICES, value) if value.strip() else ""

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        return _one_of("dtype", DTYPE_CHOICES, value or "auto")

    @field_validator("blas")
    @classmethod
    def _blas(cls, value: str) -> str:
        return value.strip().lower() or "auto"

    @property
    def requested_device(self) -> str:
        """--device (SWAMA_DEVICE), else the install-time backend name (SWAMA_BACKEND), else auto."""
        if self.device:
            return self.device
        return {"cuda": "gpu", "gpu": "gpu", "metal": "gpu", "cpu": "cpu"}.get(self.backend.strip().lower(), "auto")


def default_of(name: str) -> Any:
    """An engine option's default, for code that runs without settings (tests, benchmarks)."""
    return EngineSettings.model_fields[name].default


class SettingsError(EngineError, ValueError):
    """A setting out of its bounds, worded for the person who set it."""

    status = 400
    code = "invalid_setting"


S = TypeVar("S", bound=BaseSettings)


def flag_of(cls: type[BaseSettings], name: str) -> str:
    """The command-line flag a field is set with (its environment variable when it has none)."""
    info = cls.model_fields[name]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if not extra.get("cli", True):
        return env_of(cls, name)
    flags = extra.get("flags") or [f"--{name.replace('_', '-')}"]
    return str(flags[0])


def env_of(cls: type[BaseSettings], name: str) -> str:
    alias = cls.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    return f"{PREFIX}{name.upper()}"


def _worded(cls: type[BaseSettings], error: Any) -> str:
    name = str(error["loc"][0]) if error["loc"] else ""
    where = flag_of(cls, name) if name in cls.model_fields else name
    ctx, got = error.get("ctx") or {}, error.get("input")
    bounds = {"greater_than_equal": f"at least {ctx.get('ge')}", "greater_than": f"more than {ctx.get('gt')}",
              "less_than_equal": f"at most {ctx.get('le')}", "less_than": f"less than {ctx.get('lt')}"}
    if error["type"] in bounds:
        return f"{where} must be {bounds[error['type']]} (got {got})"
    if error["type"] == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{where}: {error['msg'].lower()} (got {got!r})"


def read(cls: type[S], **values: Any) -> S:
    """Settings of `cls` from `values`, the environment and the defaults; SettingsError, naming the
    flag and the bound, when a value does not fit."""
    try:
        return cls(**values)
    except pydantic.ValidationError as exc:
        raise SettingsError(_worded(cls, exc.errors()[0])) from None
