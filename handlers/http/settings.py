"""The server's settings: the engine's options (engine/settings.py) and the HTTP server's own, each
written once with its default, its environment variable, its help text and its bounds; the
`swama serve` flags are made from these fields."""

from __future__ import annotations

from swama.engine.client import DEFAULT_MODEL, EngineClient, EngineSettings, InstalledModel, option


class ServerSettings(EngineSettings):
    host: str = option("127.0.0.1", "address to bind; 0.0.0.0 exposes the API to the network", metavar="HOST")
    port: int = option(28100, "port to listen on", metavar="PORT", ge=1, le=65535)
    api_key: str | None = option(None, "require 'Authorization: Bearer KEY' on every route", metavar="KEY",
                                 default_text="none")
    log_level: str = option("info", "how much the server logs", choices=("critical", "error", "warning", "info",
                                                                         "debug"))
    ui: bool = option(True, "do not serve the browser playground at / and /ui/; the API is unchanged",
                      flags=("--no-ui",))
    clef_model: str | None = option(
        None, "the local model that answers Cloudflare's @cf/cloudflare/clef and clef-flash", metavar="NAME",
        default_text="the server's model, as for System One's jev-latest")
    # The model `swama serve MODEL` was started with: the command's argument, not a flag.
    default_model: str | None = option(None, "the server's default model", cli=False)


def server_default_model(settings: ServerSettings, engine: EngineClient) -> InstalledModel | None:
    """The server's default model: the one `swama serve` was started with, else the offline default
    model when it is installed (what System One's default names and Clef's cards mean here)."""
    for candidate in (settings.default_model, DEFAULT_MODEL):
        if candidate and (default := engine.find(candidate)) is not None:
            return default
    return None
