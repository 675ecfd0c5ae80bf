"""The `swama` command line."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys

from swama.handlers.settings import DEFAULT_PORT, Settings

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

    from swama.handlers.app import create_app

    settings = Settings()
    if args.host is not None:
        settings.host = args.host
    if args.port is not None:
        settings.port = args.port
    if args.api_key is not None:
        settings.api_key = args.api_key
    if _exposed(settings.host):
        print(f"warning: binding {settings.host} exposes the API to other machines on the network"
              + ("" if settings.api_key else "; consider --api-key"), file=sys.stderr)
    app = create_app(settings)
    print(f"swama listening on http://{settings.host}:{settings.port}  (models: {settings.models_root})",
          file=sys.stderr)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level,
                timeout_graceful_shutdown=3)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swama",
        description="A local AI server on MLX with an OpenAI-compatible API, decision scoring "
                    "(/v1/decisions, /v1/systemone) and a model store. With no command, `swama` runs `serve`.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="start the API server",
                           description="Start the HTTP API server. It binds 127.0.0.1 unless told otherwise.")
    serve.add_argument("--host", default=None,
                       help="address to bind (default 127.0.0.1, env SWAMA_HOST); 0.0.0.0 exposes the API")
    serve.add_argument("--port", type=int, default=None, help=f"port (default {DEFAULT_PORT}, env SWAMA_PORT)")
    serve.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every route (env SWAMA_API_KEY)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["serve", *argv]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
