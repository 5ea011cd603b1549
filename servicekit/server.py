"""Start a `grpc.aio` server the way every streamrag service does.

One call gives a service: its servicers, `grpc.health.v1` health checking (per service name
and overall), server reflection, a Prometheus metrics HTTP endpoint, and graceful shutdown
on SIGTERM/SIGINT (health flips to NOT_SERVING, in-flight RPCs get `grace_s` to finish).

    runner = ServiceRunner(config, [(inference_pb2_grpc.add_InferenceServicer_to_server, servicer)],
                           [inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name])
    await runner.start()
    await runner.wait()        # returns after SIGTERM and a graceful stop
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from servicekit.config import ServiceConfig

log = logging.getLogger(__name__)

AddServicerFn = Callable[[Any, grpc.aio.Server], None]
# Messages up to 64 MiB: a retrieval chunk carries whole documents.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


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
    ) -> None:
        self.config = config
        self.service_names = list(service_names)
        self.health = health.aio.HealthServicer()
        self.registry = registry
        self._stopped = asyncio.Event()
        self._metrics_httpd = None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
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
        self.port = self.server.add_insecure_port(self.config.address)
        if self.port == 0:
            raise OSError(f"{self.config.service}: could not bind {self.config.address}")
        if self.config.metrics_port is not None:
            self._metrics_httpd, _ = start_http_server(
                self.config.metrics_port, addr=self.config.host, registry=self.registry)
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
        """Graceful stop: NOT_SERVING first (routers stop sending), then drain, then close."""
        if self._stopped.is_set():
            return
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.config.grace_s if grace_s is None else grace_s)
        if self._metrics_httpd is not None:
            self._metrics_httpd.shutdown()
            self._metrics_httpd.server_close()
        self._stopped.set()

    async def wait(self) -> None:
        await self._stopped.wait()


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
