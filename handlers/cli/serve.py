"""`swama serve`: the HTTP API server, configured by ServerSettings (flags over environment over defaults)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

from swama.engine.client import EngineSettings, RuntimeSettings, model_files, read, startup_note
from swama.handlers.cli.options import add_options, given
from swama.handlers.http.settings import ServerSettings

# Idle connections stay open longer than clients keep them (httpx, under the openai and anthropic SDKs,
# drops them after 5 s, uvicorn's own default): with equal clocks a request sent as the server closes
# the connection is lost ("Server disconnected").
KEEP_ALIVE_S = 75


def add_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="start the API server",
                           description="Start the HTTP API server. It binds 127.0.0.1 unless told otherwise.")
    serve.add_argument("model", nargs="?", default=None,
                       help="a default model: installed first if missing, and used for clients that name "
                            "none of ours (e.g. System One's jev-latest)")
    # The server's own options first, then the engine's, then the process-wide ones.
    add_options(serve, ServerSettings, only=ServerSettings.model_fields.keys() - EngineSettings.model_fields.keys())
    add_options(serve, EngineSettings)
    add_options(serve, RuntimeSettings)
    serve.set_defaults(func=run)


def _exposed(host: str) -> bool:
    if host in ("localhost", ""):
        return host == ""
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: assume it may resolve to a public interface


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from swama.handlers.http.app import create_app

    settings = read(ServerSettings, **given(args, ServerSettings), default_model=args.model)
    files = model_files(settings)
    for name in filter(None, (settings.default_model, settings.clef_model)):
        files.find_or_pull(name)  # at start-up only; requests never download
    if _exposed(settings.host):
        print(f"warning: binding {settings.host} exposes the API to other machines on the network"
              + ("" if settings.api_key else "; consider --api-key"), file=sys.stderr)
    if note := startup_note():
        print(note, file=sys.stderr)
    if settings.replicated:
        from swama.handlers.scale.replicas import serve_replicas

        return serve_replicas(settings)
    if os.environ.get("MLX_RANK") is not None:  # started as one rank of a group (mlx.launch or --ranks)
        from swama.handlers.scale.ranks import join_as_rank

        if (status := join_as_rank(settings)) is not None:
            return status  # a rank other than 0: it followed rank 0 until the group ended
    elif settings.rank_group:
        from swama.handlers.scale.ranks import serve_ranks

        return serve_ranks(settings)
    app = create_app(settings)
    print(f"swama listening on http://{settings.host}:{settings.port}  (models: {settings.models_root})",
          file=sys.stderr)
    if settings.ui:
        print(f"playground: open http://{settings.host}:{settings.port}/ in a browser (--no-ui turns it off)",
              file=sys.stderr)
    # swama writes its own access line per request (with the request id), so uvicorn's is off.
    logging.getLogger("swama.access").setLevel(settings.log_level.upper())
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                timeout_graceful_shutdown=3, access_log=False, timeout_keep_alive=KEEP_ALIVE_S)
    return 0
