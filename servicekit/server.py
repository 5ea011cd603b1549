"""Start a `grpc.aio` server the way every streamrag service does.

One call gives a service: its servicers, `grpc.health.v1` health checking (per service name
and overall), server reflection, a Prometheus metrics HTTP endpoint, graceful shutdown
on SIGTERM/SIGINT (health flips to NOT_SERVING, then the calls in flight get up to `grace_s`
to finish and the process exits as soon as they have: `servicekit.drain`), and
INVALID_ARGUMENT for request bytes that do not parse (`RejectUndecodableRequests`). Optional:
more interceptors (run first, e.g. `servicekit.auth.ApiKeyInterceptor`) and TLS on the port
(`servicekit.tls.TlsFiles`: mutual when it names a CA).

    runner = ServiceRunner(config, [(inference_pb2_grpc.add_InferenceServicer_to_server, servicer)],
                           [inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name])
    await runner.start()
    await runner.wait()        # returns after SIGTERM and a graceful stop
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import REGISTRY, CollectorRegistry

from servicekit.channels import SERVER_KEEPALIVE_OPTIONS
from servicekit.config import ServiceConfig
from servicekit.drain import InFlightCalls
from servicekit.metrics_http import start_metrics_server
from servicekit.tls import TlsFiles

log = logging.getLogger(__name__)

AddServicerFn = Callable[[Any, grpc.aio.Server], None]
# Messages up to 64 MiB: a retrieval chunk carries whole documents.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class UndecodableRequest(ValueError):
    """A request message whose bytes do not parse (corrupt wire format, a string that is not
    UTF-8). Raised where a handler reads a request stream; a servicer that reads in a task of
    its own answers it with INVALID_ARGUMENT itself."""


class _Undecodable:
    """What a unary request's deserializer gives instead of a message (it runs before the handler)."""

    def __init__(self, error: str) -> None:
        self.error = error


class RejectUndecodableRequests(grpc.aio.ServerInterceptor):
    """Answer request bytes that do not parse with INVALID_ARGUMENT, logged as a warning (gRPC's
    own answer is UNKNOWN "Unexpected DecodeError", logged as a servicer exception).

    Every async handler gets a deserializer that catches the parse error: for a unary request it
    returns a marker the wrapped handler aborts on; in a request stream it raises
    `UndecodableRequest` where the handler reads, and the call is aborted if that escapes it."""

    def __init__(self) -> None:
        self._handlers: dict[str, tuple[Any, Any]] = {}   # method -> (gRPC's handler, wrapped)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        known = self._handlers.get(method)
        if known is None or known[0] is not handler:
            known = self._handlers[method] = (handler, _tolerant(handler, method))
        return known[1]


def _tolerant(handler, method: str):
    """`handler` with a deserializer that catches parse errors and a behavior that answers them."""
    kind = f"{'stream' if handler.request_streaming else 'unary'}_{'stream' if handler.response_streaming else 'unary'}"
    behavior, parse = getattr(handler, kind), handler.request_deserializer
    if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
        return handler   # a sync handler: left as it is

    def deserialize(data: bytes):
        try:
            return parse(data)
        except Exception as exc:   # protobuf's DecodeError
            log.warning("%s: undecodable request message (%d bytes): %s", method, len(data), exc)
            if handler.request_streaming:
                raise UndecodableRequest(f"undecodable request message: {exc}") from None
            return _Undecodable(str(exc))

    async def check(request, context) -> None:
        if isinstance(request, _Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request message: {request.error}")

    if inspect.iscoroutinefunction(behavior):
        async def wrapped(request, context):
            await check(request, context)
            try:
                return await behavior(request, context)
            except UndecodableRequest as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    else:
        async def wrapped(request, context):
            await check(request, context)
            try:
                async with contextlib.aclosing(behavior(request, context)) as responses:
                    async for response in responses:
                        yield response
            except UndecodableRequest as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    make = getattr(grpc, f"{kind}_rpc_method_handler")
    return make(wrapped, request_deserializer=deserialize, response_serializer=handler.response_serializer)


class ServiceRunner:
    """Owns one gRPC server, its health servicer and its metrics endpoint."""

    def __init__(
        self,
        config: ServiceConfig,
        servicers: Sequence[tuple[AddServicerFn, Any]],
        service_names: Sequence[str],
        *,
        registry: CollectorRegistry = REGISTRY,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        tls: TlsFiles | None = None,
        options: Sequence[tuple[str, object]] = (),
    ) -> None:
        self.config = config
        self.tls = tls
        self.service_names = list(service_names)
        self.health = health.aio.HealthServicer()
        self.registry = registry
        self._stopped = asyncio.Event()
        self._stopping = False
        self.calls = InFlightCalls()
        self._metrics_httpd = None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.server = grpc.aio.server(interceptors=[self.calls, *interceptors, RejectUndecodableRequests()], options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            *SERVER_KEEPALIVE_OPTIONS,      # the pings of every client channel (servicekit.channels)
            *options,
        ])
        for add, servicer in servicers:
            add(servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME],
            self.server,
        )

    async def start(self, *, handle_signals: bool = True) -> int:
        """Bind, start serving and mark every service SERVING. Returns the bound gRPC port."""
        if self.tls is not None and self.tls.serves:
            self.port = self.server.add_secure_port(self.config.address, self.tls.server_credentials())
        else:
            self.port = self.server.add_insecure_port(self.config.address)
        if self.port == 0:
            raise OSError(f"{self.config.service}: could not bind {self.config.address}")
        if self.config.metrics_port is not None:
            self._metrics_httpd = start_metrics_server(self.config.metrics_port, self.config.host, self.registry)
            self.metrics_port = self._metrics_httpd.server_port
        await self.server.start()
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.stop()))
        log.info("%s serving gRPC on %s:%s, metrics on %s", self.config.service, self.config.host,
                 self.port, self.metrics_port)
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop: NOT_SERVING first (routers stop sending), then drain the calls in flight
        (up to `grace_s`; at once when none is), then close (whatever is left is cancelled)."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        grace = self.config.grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        if self.calls.count:
            log.info("%s: NOT_SERVING; draining %d call(s) for up to %g s", self.config.service,
                     self.calls.count, grace)
        if not await self.calls.wait_idle(grace):
            log.warning("%s: %d call(s) still in flight after %g s: cancelled", self.config.service,
                        self.calls.count, grace)
        await self.server.stop(0)
        if self._metrics_httpd is not None:
            self._metrics_httpd.shutdown()
            self._metrics_httpd.server_close()
        self._stopped.set()

    async def wait(self) -> None:
        await self._stopped.wait()


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
