"""The retriever runner: a retriever (ANNS, crawler, replay, or any `RetrieverBackend`) in this process
or as its own process, ready when its gRPC health says SERVING.

- `RunningRetriever(backend, "anns")`: on a `LoopThread` (its own, or `host=` one shared with other
  services), for synchronous tests; `.address`, `.stop()`.
- `async with serving_retriever(backend) as stub`: in the calling test's own event loop, for async
  tests that talk to it through `grpc.aio`.
- `RetrieverProcess("anns", log, "--index", DIR, ...)`: `python -m retriever_svc.server --kind KIND`
  on a port fixed for its life, so it can be killed and started again there.

All three build the server as the service does (`retriever_svc.server.build_runner`: Retriever, and
Collections where the backend has them).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from protos import retriever_pb2_grpc
from retriever_svc.server import build_runner
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner
from tests.support.redis_server import free_port
from tests.support.serving import ChildProcess, LoopThread, wait_serving


def _runner(backend, name: str, **options) -> ServiceRunner:
    runner, _background = build_runner(ServiceConfig(service=name, port=0, metrics_port=None, grace_s=0), backend,
                                       **options)
    return runner


class RunningRetriever:
    """`backend` served in this process; `**options`: `build_runner` keywords (`api_keys`, `tls`)."""

    def __init__(self, backend, name: str, *, host: LoopThread | None = None, **options) -> None:
        self.name = name
        self.owns_host = host is None
        self.host = host or LoopThread(f"{name}-test-server")

        async def start() -> int:          # built in its loop: a grpc.aio server belongs to one
            self.runner = _runner(backend, name, **options)
            return await self.runner.start(handle_signals=False)

        self.port = self.host.run(start(), 60)
        self.address = f"127.0.0.1:{self.port}"
        wait_serving(self.address, what=f"{name} retriever")

    def stop(self) -> None:
        if self.host.alive:
            self.host.run(self.runner.stop(0), 30)
        if self.owns_host:
            self.host.close()


@dataclass
class RetrieverStubs:
    address: str
    retriever: retriever_pb2_grpc.RetrieverStub
    collections: retriever_pb2_grpc.CollectionsStub


@contextlib.asynccontextmanager
async def serving_retriever(backend, name: str = "retriever", **options) -> AsyncIterator[RetrieverStubs]:
    """`backend` served in the running event loop (SERVING once `start()` returns: a health check from
    this loop would block it), and aio stubs on it; stopped on exit. `**options`: `build_runner` keywords."""
    runner = _runner(backend, name, **options)
    port = await runner.start(handle_signals=False)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield RetrieverStubs(f"127.0.0.1:{port}", retriever_pb2_grpc.RetrieverStub(channel),
                             retriever_pb2_grpc.CollectionsStub(channel))
    finally:
        await channel.close()
        await runner.stop(0)


class RetrieverProcess(ChildProcess):
    """`python -m retriever_svc.server --kind KIND ARGS` on a free port, output to `log`. It waits until
    SERVING unless `wait=False` (a test that kills it before: `start()` runs it again, and waits)."""

    def __init__(self, kind: str, log: Path, *args: str, wait: bool = True, env: dict[str, str] | None = None,
                 tls=None) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        super().__init__([sys.executable, "-m", "retriever_svc.server", "--kind", kind, *args, "--host", "127.0.0.1",
                          "--port", str(self.port), "--metrics-port", "-1"], self.address, log, tls=tls, env=env,
                         what=f"{kind} retriever")
        self.start() if wait else self.launch()
