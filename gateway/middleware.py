"""What every request passes before its endpoint, as ASGI middleware (outermost first):

1. `RequestMetrics`: counts the request by route template and final status (a WebSocket
   counts 101 once accepted, or its refusal's status).
2. `RequireApiKey`: under `/v1/`, a request without a configured key as its bearer token is
   answered 401 with the error body (a WebSocket gets the 401 as its handshake response), and
   the endpoint never runs; an accepted one carries its key's tenant in its state
   (`gateway.tenancy.tenant_of`). `/health` and `/metrics` stay open.
3. `LimitBody`: a body over the limit (by Content-Length, or counted as it arrives) is
   answered 413; a smaller one is read whole and handed on.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.tenancy import set_tenant
from servicekit.auth import ApiKeys, bearer_token
from servicekit.tenants import Tenants

PROTECTED_PREFIX = "/v1/"


class RequestMetrics:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, routes: Sequence[BaseRoute]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    def route_of(self, scope: Scope) -> str:
        """The template of the route `scope` asks for (also when a middleware answered first)."""
        for route in self.routes:
            if route.matches(scope)[0] == Match.FULL:
                return getattr(route, "path", "unmatched")
        return "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def observed_send(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                status["code"] = message["status"]
            elif message["type"] == "websocket.accept":
                status["code"] = 101
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            self.metrics.requests.labels(self.route_of(scope), str(status["code"])).inc()


class RequireApiKey:
    def __init__(self, app: ASGIApp, keys: ApiKeys, tenants: Tenants | None = None) -> None:
        self.app, self.keys, self.tenants = app, keys, tenants or Tenants()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not scope["path"].startswith(PROTECTED_PREFIX):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        token = bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
        if self.keys.accepts(token):
            tenant = self.tenants.of_key(token)
            if tenant is not None:
                set_tenant(scope, tenant)
            await self.app(scope, receive, send)
            return
        refusal = GatewayError(401, "missing or invalid API key: send 'Authorization: Bearer KEY'",
                               code="invalid_api_key").response()
        if scope["type"] == "websocket":
            await WebSocket(scope, receive, send).send_denial_response(refusal)
        else:
            await refusal(scope, receive, send)


class LimitBody:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":          # the client left before its body arrived
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()       # after the body: waits for the client to disconnect

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = GatewayError(413, f"the request body is larger than {self.max_bytes} bytes", code="body_too_large")
        await error.response()(scope, receive, send)
