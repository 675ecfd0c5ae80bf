"""The `swama` command line: one module per command (serve, run, transcribe, calibrate, the model
store's pull, create, list, aliases and rm, and batches, a running server's batch jobs), each adding
its own parser; the flags of the server's options are made from the settings (options.py)."""

from __future__ import annotations

import argparse
import logging
import sys

from swama.engine.client import EngineError, RuntimeSettings, SettingsError, prepare_process, read
from swama.handlers.cli import batches, calibrate, models, run, serve, transcribe
from swama.handlers.cli.options import export
from swama.handlers.http.version import package_version

log = logging.getLogger("swama")
# Commands that run models: they get the BLAS preload and the device before anything else.
MODEL_COMMANDS = ("serve", "run", "transcribe", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swama",
        description="A local AI server on MLX with an OpenAI-compatible API, decision scoring "
                    "(/v1/decisions, /v1/systemone) and a model store. With no command, `swama` runs `serve`.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"swama {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parser(sub)
    run.add_parser(sub)
    transcribe.add_parser(sub)
    calibrate.add_parser(sub)
    models.add_parsers(sub)
    batches.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "-V", "--version"):
        argv = ["serve", *argv]
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    # --device and --dtype become the environment the engine reads (and a BLAS restart keeps).
    export(args, RuntimeSettings)
    try:
        if args.command in MODEL_COMMANDS:
            read(RuntimeSettings)
            prepare_process(argv)
    except (RuntimeError, ValueError) as exc:  # a device or dtype this machine cannot give
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except SettingsError as exc:  # an option out of its bounds, from a flag or the environment
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
