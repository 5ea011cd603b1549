"""One whole stack per module (model load, index build and servers take a few seconds), and two
replicas behind an orchestrator for the failover tests."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from orchestrator.server import OrchestratorService
from protos import orchestrator_pb2_grpc
from servicekit.config import ServiceConfig
from tests.e2e.stack_harness import Stack
from tests.service.inference_harness import RunningInference
from tests.support.redis_server import PrivateRedis


@pytest.fixture(scope="module")
def stack(embedded_model_dir, tmp_path_factory):
    stack = Stack(embedded_model_dir, tmp_path_factory.mktemp("stack"))
    yield stack
    stack.stop()


@pytest.fixture
def two_replicas(embedded_model_dir, tmp_path):
    """Two replicas behind an orchestrator; everything started is stopped, even if set-up fails."""
    redis = PrivateRedis(tmp_path)
    replicas: list[RunningInference] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    service = channel = None

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(120)

    async def start():
        # The router refreshes its stats rarely here, so it keeps trusting a replica that just died.
        orchestrator = OrchestratorService(ServiceConfig("orchestrator", port=0, metrics_port=None, grace_s=0),
                                           redis_url=redis.url, inference=[r.address for r in replicas],
                                           retrievers={}, router_refresh_s=3600)
        return orchestrator, await orchestrator.start(handle_signals=False)

    try:
        replicas.extend(RunningInference(embedded_model_dir, kv_device_blocks=128, token_budget=256)
                        for _ in range(2))
        service, port = run(start())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        yield orchestrator_pb2_grpc.OrchestratorStub(channel), service, replicas, channel, redis
    finally:
        if channel is not None:
            channel.close()
        if service is not None:
            run(service.stop(0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        for replica in replicas:
            if replica.thread.is_alive():
                replica.stop()
        redis.stop()
