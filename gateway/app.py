"""The gateway's FastAPI app: its routes, its middleware and its error handlers.

    GET  /v1/models, /v1/models/{model}     serving_models.py
    POST /v1/chat/completions               serving_chat.py
    POST /v1/completions                    serving_completion.py
    WS   /v1/realtime                       realtime.py
    GET  /health                            200 while the process serves (no key needed); says whether the
                                            service is saturated (it shed a request lately)
    GET  /metrics                           Prometheus text (no key needed)

Every error leaves as the OpenAI error body (gateway/errors.py): a `GatewayError` with its
status, a request the models refuse as 400 (malformed JSON included), an unknown path as
404, anything unexpected as 500.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from gateway.errors import GatewayError, error_body
from gateway.metrics import GatewayMetrics
from gateway.middleware import LimitBody, RequestMetrics, RequireApiKey
from gateway.realtime import realtime
from gateway.server_args import MAX_BODY_BYTES
from gateway.serving_chat import create_chat_completion
from gateway.serving_completion import create_completion
from gateway.serving_models import list_models, retrieve_model
from gateway.upstream import Upstream
from servicekit.auth import ApiKeys
from servicekit.config import DEFAULT_PORTS
from servicekit.tenants import Tenants, parse_tenants
from servicekit.tls import TlsFiles

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewaySettings:
    """Where the services are and who may call."""

    orchestrator: str = f"127.0.0.1:{DEFAULT_PORTS['orchestrator']}"    # every request goes there
    api_keys: tuple[str, ...] = ()            # none: no key needed
    tenants: Tenants | None = None            # the tenants file's (plus api_keys, each its own); None: api_keys'
    upstream_tls: TlsFiles | None = None      # with a CA: TLS (mutual with a cert) to the orchestrator
    max_body_bytes: int = MAX_BODY_BYTES


def _validation_error(exc: RequestValidationError) -> GatewayError:
    """The first problem (ours before pydantic's generic ones) as one 400."""
    errors = sorted(exc.errors(), key=lambda e: e.get("type") != "value_error")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return GatewayError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}",
                            code="invalid_json")
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = str(first["msg"]).removeprefix("Value error, ")
    return GatewayError(400, f"{where}: {message}" if where else message, param=where or None)


def build_app(settings: GatewaySettings) -> FastAPI:
    metrics = GatewayMetrics()
    tenants = settings.tenants if settings.tenants is not None else parse_tenants("", settings.api_keys)
    keys = ApiKeys(tenants.keys or settings.api_keys)
    upstream = Upstream(settings.orchestrator, keys.own, settings.upstream_tls)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await upstream.start()
        try:
            yield
        finally:
            await upstream.close()

    app = FastAPI(title="streamrag gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.upstream, app.state.metrics, app.state.settings = upstream, metrics, settings
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model:path}", retrieve_model, methods=["GET"])
    app.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"])
    app.add_api_route("/v1/completions", create_completion, methods=["POST"])
    app.add_api_websocket_route("/v1/realtime", realtime)
    app.add_api_route("/health", lambda: {"status": "ok", **metrics.saturation()}, methods=["GET"])
    app.add_api_route("/metrics", lambda: Response(metrics.exposition(), media_type=metrics.content_type),
                      methods=["GET"])

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        if exc.status == 503 and "Retry-After" in exc.headers:      # a request shed: not started in time
            metrics.note_shed()
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)

    # add_middleware puts each in front of the ones before it: the request meets them in reverse order.
    app.add_middleware(LimitBody, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequireApiKey, keys=keys, tenants=tenants)
    app.add_middleware(RequestMetrics, metrics=metrics, routes=app.router.routes)
    return app
