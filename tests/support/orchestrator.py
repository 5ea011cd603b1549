"""The orchestrator runner: the Orchestrator service in this process (`RunningOrchestrator`) or as its
own process (`OrchestratorProcess`, `python -m orchestrator.server`, so a test can SIGKILL it
mid-answer), both ready when their gRPC health says SERVING.

    orchestrator = RunningOrchestrator(redis.url, [replica.address], {"anns": anns.address})
    orchestrator.stub.Ask(...); orchestrator.service.router ...; orchestrator.stop()
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import grpc

from orchestrator.server import OrchestratorService
from protos import orchestrator_pb2_grpc
from servicekit.config import ServiceConfig
from servicekit.tls import TlsFiles
from tests.support.redis_server import free_port
from tests.support.serving import ChildProcess, LoopThread, wait_serving


class RunningOrchestrator:
    """In this process, on `host` (a `LoopThread` shared with other services) or a loop of its own.
    `client_tls`: what the test's channel and the health check present (default: plaintext).
    `**options`: `OrchestratorService` keywords (`router_refresh_s`, `api_keys`, `tls`, ...)."""

    def __init__(self, redis_url: str, inference: list[str], retrievers: dict[str, str] | None = None, *,
                 host: LoopThread | None = None, client_tls: TlsFiles | None = None, **options) -> None:
        self.owns_host = host is None
        self.host = host or LoopThread("orchestrator-test-server")
        self.thread = self.host.thread

        async def start() -> int:          # built in its loop: a grpc.aio server belongs to one
            self.service = OrchestratorService(ServiceConfig("orchestrator", port=0, metrics_port=None, grace_s=0),
                                               redis_url=redis_url, inference=inference,
                                               retrievers=retrievers or {}, **options)
            return await self.service.start(handle_signals=False)

        self.service: OrchestratorService | None = None
        try:
            self.port = self.host.run(start(), 120)
            self.address = f"127.0.0.1:{self.port}"
            wait_serving(self.address, tls=client_tls, what="orchestrator")
        except BaseException:
            self.stop()
            raise
        self.channel = (grpc.secure_channel(self.address, client_tls.channel_credentials()) if client_tls
                        else grpc.insecure_channel(self.address))
        self.stub = orchestrator_pb2_grpc.OrchestratorStub(self.channel)

    def run(self, coro, timeout_s: float = 120):
        """Run a coroutine on the service's loop (its store, router and servicer live there)."""
        return self.host.run(coro, timeout_s)

    def stop(self) -> None:
        if getattr(self, "channel", None) is not None:
            self.channel.close()
            self.channel = None
        if self.service is not None and self.host.alive:
            self.host.run(self.service.stop(0), 120)
            self.service = None
        if self.owns_host:
            self.host.close()


class OrchestratorProcess(ChildProcess):
    """`python -m orchestrator.server` on a free port, over `inference` replicas and the retrievers named;
    `args`: more flags (TLS, ...); `env`: more environment (STREAMRAG_API_KEY, ...)."""

    def __init__(self, redis_url: str, inference: list[str], *, anns: str = "", crawler: str = "", replay: str = "",
                 log_path: Path | None = None, ready_s: float = 120.0, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, tls: TlsFiles | None = None) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "orchestrator.server", "--port", str(self.port), "--metrics-port", "-1",
                "--grace", "0", "--redis", redis_url, "--anns", anns, "--crawler", crawler, "--replay", replay]
        for address in inference:
            argv += ["--inference", address]
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="streamrag-test-orchestrator-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        super().__init__([*argv, *args], self.address, log_path, tls=tls, env=env, ready_s=ready_s, what="orchestrator")
        self.start()

    @property
    def proc(self):
        return self.process
