"""The FastAPI application: the generated routes, the operational endpoints beside them (/openapi.json,
/metrics, /health, the playground) and one envelope for unknown paths and methods."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from swama.engine.client import SERVING_LINE, EngineClient, current_group, open_engine
from swama.generated.routes import router
from swama.handlers.batch.runner import BatchRunner
from swama.handlers.batch.store import BatchStore
from swama.handlers.http.errors import ApiError, error_body
from swama.handlers.http.observability import AccessMiddleware, Metrics
from swama.handlers.http.openapi import family_for, merged_spec
from swama.handlers.http.origins import guard_origins
from swama.handlers.http.pipeline import key_given
from swama.handlers.http.playground import mount_playground
from swama.handlers.http.settings import ServerSettings, server_default_model
from swama.handlers.http.version import package_version


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    engine = open_engine(settings, server=True)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            # Files and batch jobs: durable, in the data folder; the jobs left unfinished resume now.
            store = app.state.batch_store = BatchStore(settings.data_dir)
            batches = app.state.batches = BatchRunner(app, store, settings.batch_lines, settings.api_key)
            metrics.watch_batches(batches.line_counts)
            await batches.start()
        except BaseException:  # a start-up that fails here (the data folder is another server's) ends the engine
            await engine.close()  # too: its threads, and on rank 0 the group, would keep the process alive
            raise
        if current_group() is not None:  # rank 0 of a group: the supervisor counts the group as serving now
            print(SERVING_LINE, file=sys.stderr, flush=True)
        yield
        await batches.close()
        store.close()
        await engine.close()

    app = FastAPI(title="swama", openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.include_router(router)
    guard_origins(app, settings)  # inside the access log, which records what they refuse
    metrics = _operational_endpoints(app, settings, engine)
    if settings.ui:
        mount_playground(app)
    app.add_exception_handler(StarletteHTTPException, _unknown_route)
    return app


def _operational_endpoints(app: FastAPI, settings: ServerSettings, engine: EngineClient) -> Metrics:
    """/openapi.json, /metrics and /health: beside the API, in no pinned document."""
    metrics = Metrics(engine)
    engine.on_generation = metrics.generation_finished
    engine.on_decisions = metrics.decisions_scored
    app.add_middleware(AccessMiddleware, metrics=metrics)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        _check_operational_key(request, settings)
        return JSONResponse(merged_spec())

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(request: Request) -> Response:
        _check_operational_key(request, settings)
        await engine.refresh()
        body, media_type = metrics.exposition()
        return Response(body, media_type=media_type)

    @app.get("/health", include_in_schema=False)
    async def health(request: Request) -> JSONResponse:
        if not key_given(request, settings):  # open for liveness checks, and then it tells nothing more
            return JSONResponse({"status": "ok"})
        await engine.refresh()
        status, default = engine.status(), server_default_model(settings, engine)
        return JSONResponse({"status": "ok", "version": package_version(), "models_loaded": status.models_loaded,
                             "default_model": default.id if default else None,
                             "running": status.running, "waiting": status.waiting, "blas": status.blas,
                             **({"ranks": status.ranks} if status.ranks is not None else {}),
                             **({"engine_process": status.process} if status.process is not None else {})})

    return metrics


def _check_operational_key(request: Request, settings: ServerSettings) -> None:
    if not key_given(request, settings):
        raise StarletteHTTPException(401, "Missing or wrong API key: send 'Authorization: Bearer <key>'.",
                                     headers={"WWW-Authenticate": "Bearer"})


def _workers_ai_model(path: str) -> str | None:
    """The model a Workers AI run path names (`.../accounts/ID/ai/run/@cf/meta/llama` -> `@cf/meta/llama`)."""
    match = re.fullmatch(r"(?:/client/v4)?/accounts/[^/]+/ai/run/(.+)", path)
    return match.group(1) if match else None


async def _unknown_route(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Unknown paths and methods: the same envelope as the routes, never an HTML page."""
    path = request.url.path
    if path.startswith("/v1/responses/") and exc.status_code in (404, 405):
        # Nothing is stored, so there is no retrieve, cancel or delete by id.
        message = ("Responses are not stored on this server; there is no retrieve, cancel or delete "
                   f"by response id ({request.method} {path}).")
        return JSONResponse(error_body("openai", ApiError(404, message, code="not_found")), status_code=404)
    family = family_for(path)
    status = exc.status_code
    code = "not_found" if exc.status_code == 404 else None
    if exc.status_code == 405 and family == "workers_ai":
        code = "method_not_allowed"
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}."
    elif exc.status_code == 404 and (model := _workers_ai_model(path)):
        # Workers AI answers an unknown model with its "No such model" error, a 400.
        message, code, status = f"No such model {model} or task.", "model_not_found", 400
    elif exc.status_code == 404:
        message = f"Unknown route: {request.method} {request.url.path}."
    elif exc.status_code == 401:
        code = "invalid_api_key"
        message = str(exc.detail)
    else:
        message = str(exc.detail)
    err = ApiError(status, message, code=code)
    headers = getattr(exc, "headers", None)
    if exc.status_code == 405:  # every method the path takes, not only those of the first route that matched it
        headers = {**(headers or {}), "Allow": ", ".join(_methods_of(request))}
    return JSONResponse(error_body(family, err), status_code=status, headers=headers)


def _methods_of(request: Request) -> list[str]:
    path = request.url.path
    return sorted({method for route in request.app.router.routes
                   if isinstance(route, APIRoute) and route.path_regex.match(path) for method in route.methods})
