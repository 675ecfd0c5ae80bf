"""The FastAPI application: generated routes, our merged OpenAPI document, uniform 404/405."""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from swama.engine.serving.engine import Engine, EngineOptions
from swama.generated.routes import OPERATIONS, router
from swama.handlers.http.errors import ApiError, error_body
from swama.handlers.http.observability import AccessMiddleware, Metrics
from swama.handlers.http.playground import mount_playground
from swama.handlers.http.settings import Settings
from swama.handlers.http.version import package_version
from swama.handlers.routes.systemone import default_model_of

SPEC_FILES = ("openai.yaml", "decisions.yaml", "systemone.yaml", "workers_ai.yaml")


@functools.cache
def merged_spec() -> dict[str, Any]:
    """One OpenAPI document for every route we serve, built from the pinned specs."""
    merged: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "swama", "version": package_version()},
        "paths": {},
        "components": {"schemas": {}},
    }
    folder = resources.files("swama.specs")
    for name in SPEC_FILES:
        doc = yaml.load(folder.joinpath(name).read_text(encoding="utf-8"),
                        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        for path, item in doc["paths"].items():
            merged["paths"].setdefault(path, {}).update(item)
        for schema, body in doc["components"]["schemas"].items():
            if schema in merged["components"]["schemas"] and merged["components"]["schemas"][schema] != body:
                raise RuntimeError(f"component {schema} differs between pinned specs")
            merged["components"]["schemas"][schema] = body
    return merged


def _family_for(path: str) -> str:
    if path.startswith(("/client/v4/", "/accounts/")):
        return "workers_ai"  # Cloudflare's API space: its envelope, whatever the route
    for op in OPERATIONS.values():
        if op.path == path:
            return op.family if op.family in ("decisions", "systemone") else "openai"
    return "openai"


def _workers_ai_model(path: str) -> str | None:
    """The model a Workers AI run path names (`.../accounts/ID/ai/run/@cf/meta/llama` -> `@cf/meta/llama`)."""
    match = re.fullmatch(r"(?:/client/v4)?/accounts/[^/]+/ai/run/(.+)", path)
    return match.group(1) if match else None


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    engine = Engine(EngineOptions(models_root=settings.models_root, context_limit=settings.context_limit,
                                  idle_seconds=settings.idle_seconds,
                                  decision_prefix_reuse=settings.decision_prefix_reuse,
                                  default_max_tokens=settings.default_max_tokens,
                                  max_queue=settings.max_queue, max_model_queue=settings.max_model_queue,
                                  queue_timeout=settings.queue_timeout, batching=settings.batching,
                                  batch_rows=settings.batch_rows, prefill_step=settings.prefill_step,
                                  memory_limit=settings.memory_limit,
                                  **({} if settings.prompt_cache_bytes is None
                                     else {"prompt_cache_bytes": settings.prompt_cache_bytes})))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await engine.close()

    app = FastAPI(title="swama", openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.include_router(router)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(merged_spec())

    metrics = Metrics(engine)
    engine.on_generation = metrics.generation_finished
    engine.on_decisions = metrics.decisions_scored
    app.add_middleware(AccessMiddleware, metrics=metrics)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        body, media_type = metrics.exposition()
        return Response(body, media_type=media_type)

    @app.get("/health", include_in_schema=False)
    async def health() -> JSONResponse:
        from swama.engine.runtime import loaded_blas

        default = default_model_of(settings, engine.store)
        return JSONResponse({"status": "ok", "version": package_version(), "models_loaded": engine.pool.loaded(),
                             "default_model": default.id if default else None,
                             "running": engine.pool.running(), "waiting": engine.pool.waiting(),
                             "blas": loaded_blas() or "bundled"})

    if settings.ui:
        mount_playground(app)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown paths and methods: the same envelope as the routes, never an HTML page.
        path = request.url.path
        if path.startswith("/v1/responses/") and exc.status_code in (404, 405):
            # Nothing is stored, so there is no retrieve, cancel or delete by id.
            message = ("Responses are not stored on this server; there is no retrieve, cancel or delete "
                       f"by response id ({request.method} {path}).")
            err = ApiError(404, message, code="not_found")
            return JSONResponse(error_body("openai", err), status_code=404)
        family = _family_for(path)
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
        else:
            message = str(exc.detail)
        err = ApiError(status, message, code=code)
        return JSONResponse(error_body(family, err), status_code=status,
                            headers=getattr(exc, "headers", None))

    return app


def openapi_json() -> str:
    return json.dumps(merged_spec())
