"""What a stopping service waits for: the calls in flight that are work, not health.

`ServiceRunner.stop` reports NOT_SERVING first (routers and probes stop sending work), then
waits until `InFlightCalls` counts no call in flight but the health and reflection ones, up to
the grace, then closes the server. gRPC's own `server.stop(grace)` cannot say that: a router's
health Watch never ends, so with one open every stop took the whole grace, and a grace long
enough to drain an answer (Kubernetes' terminationGracePeriodSeconds) held every stop that long.
A call that arrives while the service drains is still served (a client that has not seen
NOT_SERVING yet gets an answer, not a refusal), and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect

import grpc

NOT_WORK = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class InFlightCalls(grpc.aio.ServerInterceptor):
    """Counts the async calls in flight, health checks and reflection aside."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None
        self._handlers: dict[str, tuple[object, object]] = {}   # method -> (gRPC's handler, counted)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(NOT_WORK):
            return handler
        known = self._handlers.get(method)
        if known is None or known[0] is not handler:
            known = self._handlers[method] = (handler, self._counted(handler))
        return known[1]

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no call is in flight; False if some still are after `timeout_s`."""
        if self.count == 0:
            return True
        self._idle = self._idle or asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self.count == 0

    def _enter(self) -> None:
        self.count += 1

    def _leave(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    def _counted(self, handler):
        kind = "_".join("stream" if streaming else "unary"
                        for streaming in (handler.request_streaming, handler.response_streaming))
        behavior = getattr(handler, kind)
        if inspect.iscoroutinefunction(behavior):
            async def counted(request, context):
                self._enter()
                try:
                    return await behavior(request, context)
                finally:
                    self._leave()
        elif inspect.isasyncgenfunction(behavior):
            async def counted(request, context):
                self._enter()
                try:
                    async with contextlib.aclosing(behavior(request, context)) as responses:
                        async for response in responses:
                            yield response
                finally:
                    self._leave()
        else:
            return handler      # a sync handler (an interceptor's refusal): nothing to drain
        make = getattr(grpc, f"{kind}_rpc_method_handler")
        return make(counted, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)
