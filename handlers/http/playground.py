"""The browser playground: one page, its script and its style, shipped inside the package.

Nothing is fetched from elsewhere (the Content-Security-Policy forbids it), so the page works
offline. The page holds no data of its own: it reads everything through the API, so with
`--api-key` set it shows nothing until the key is entered, and sends it as a bearer token.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}
# Same-origin only: no CDN, no remote fonts or images; pictures the user drops are data: URLs.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer"}


def asset(name: str) -> bytes:
    return resources.files("swama.handlers.http").joinpath("playground_assets", name).read_bytes()


def _serve(name: str) -> Response:
    if name not in MEDIA_TYPES:
        raise StarletteHTTPException(404)
    return Response(asset(name), media_type=MEDIA_TYPES[name], headers=HEADERS)


def mount_playground(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def root() -> Response:
        return _serve("index.html")

    @app.get("/ui", include_in_schema=False)
    async def ui_bare() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @app.get("/ui/", include_in_schema=False)
    async def ui_index() -> Response:
        return _serve("index.html")

    @app.get("/ui/{name}", include_in_schema=False)
    async def ui_asset(name: str) -> Response:
        return _serve(name)
