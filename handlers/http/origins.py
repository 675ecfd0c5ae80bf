"""Which requests a browser may make of the server, checked before any route runs:

- the Host header must name this server: the bound address, a loopback name, or a host of
  `--allowed-hosts` (with a wildcard bind, `--host 0.0.0.0`, any IP address too). A page whose own
  name was rebound to 127.0.0.1 (DNS rebinding) sends its own name, and is refused;
- a request that carries an Origin (every browser POST, and fetches from scripts) must come from the
  server's own origin (the playground) or from one `--cors-origins` lists; CORS preflights for those
  are answered by Starlette's CORSMiddleware, any other origin is refused before the route runs.

Clients that are not browsers send no Origin and name the host they dialled, so they pass.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from swama.handlers.http.errors import ApiError, error_body
from swama.handlers.http.openapi import family_for
from swama.handlers.http.settings import ServerSettings

LOOPBACK_NAMES = ("localhost", "*.localhost", "127.0.0.1", "::1")
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")
DEFAULT_PORTS = {"http": 80, "https": 443}


def _refusal(scope: Scope, status: int, message: str, code: str) -> JSONResponse:
    err = ApiError(status, message, code=code)
    return JSONResponse(error_body(family_for(scope.get("path", "")), err), status_code=status)


def _ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_of(value: str | None) -> tuple[str, int | None] | None:
    """A Host header's name (lower case, IPv6 without brackets) and port; None when it does not parse."""
    if not value:
        return None
    try:
        parts = urlsplit("//" + value)
        return (parts.hostname or "").lower(), parts.port
    except ValueError:  # a port out of range, an unclosed bracket
        return None


class HostGuard(TrustedHostMiddleware):
    """Starlette's trusted-host check with the server's own patterns, an answer in the route's error
    envelope, and, where the server listens on every address, any IP address: a rebinding page can
    only send a name."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str], any_address: bool) -> None:
        super().__init__(app, allowed_hosts=allowed_hosts, www_redirect=False)
        self.any_address = any_address

    def _allowed(self, host: str) -> bool:
        if self.any_address and _ip_address(host):
            return True
        return any(host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in self.allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allow_any or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("host")
        parsed = _host_of(given)
        if parsed is not None and self._allowed(parsed[0]):
            await self.app(scope, receive, send)
            return
        message = (f"Host {given!r} is not a name this server answers to: it takes its bound address, "
                   "localhost and the hosts of --allowed-hosts (a guard against DNS rebinding).")
        await _refusal(scope, 400, message, "invalid_host")(scope, receive, send)


class OriginGuard:
    """Refuses a request whose Origin is neither the server's own nor one of `origins` ('*': any)."""

    def __init__(self, app: ASGIApp, origins: Sequence[str]) -> None:
        self.app = app
        self.origins = {o.rstrip("/").lower() for o in origins}

    def _same_origin(self, origin: str, scope: Scope, host: str | None) -> bool:
        parsed, here = urlsplit(origin), _host_of(host)
        if here is None or not parsed.hostname:
            return False
        scheme = scope.get("scheme", "http")
        try:
            origin_port = parsed.port or DEFAULT_PORTS.get(parsed.scheme)
        except ValueError:
            return False
        return (parsed.scheme == scheme and parsed.hostname.lower() == here[0]
                and origin_port == (here[1] or DEFAULT_PORTS.get(scheme)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            origin = headers.get("origin")
            if (origin is not None and "*" not in self.origins and origin.rstrip("/").lower() not in self.origins
                    and not self._same_origin(origin, scope, headers.get("host"))):
                message = (f"Requests from the web page at {origin!r} are refused: a page of another origin may "
                           "call this server only when --cors-origins lists its origin.")
                await _refusal(scope, 403, message, "cross_origin")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def allowed_hosts(settings: ServerSettings) -> tuple[list[str], bool]:
    """The Host patterns the server answers to, and whether it listens on every address."""
    any_address = settings.host in WILDCARD_ADDRESSES
    patterns = [*LOOPBACK_NAMES, *settings.allowed_host_list]
    if not any_address:
        patterns.append(settings.host.strip("[]").lower())
    return patterns, any_address


def guard_origins(app: FastAPI, settings: ServerSettings) -> None:
    """The Host check, then the Origin check, then CORS for the listed origins (the last added runs
    first): an origin not listed is refused in the route's envelope before CORS would answer it."""
    if settings.cors_origin_list:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origin_list, allow_methods=["*"],
                           allow_headers=["*"], max_age=600)
    app.add_middleware(OriginGuard, origins=settings.cors_origin_list)
    patterns, any_address = allowed_hosts(settings)
    app.add_middleware(HostGuard, allowed_hosts=patterns, any_address=any_address)
