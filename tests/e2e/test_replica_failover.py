"""An inference replica that fails before the first token: the Ask is retried once on another
replica (which is sent the prompt so far); with no replica left the caller gets UNAVAILABLE."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from orchestrator.prompt import preamble_key
from orchestrator.server import OrchestratorService
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.config import ServiceConfig
from tests.service.inference_harness import RunningInference
from tests.support.redis_server import PrivateRedis

NONE = orchestrator_pb2.RETRIEVER_CHOICE_NONE


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
        yield orchestrator_pb2_grpc.OrchestratorStub(channel), service, replicas
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


def ask(stub):
    done = None
    for response in stub.Ask(orchestrator_pb2.AskRequest(question="What is the capital of France?", retriever=NONE,
                                                         max_tokens=8), timeout=120):
        if response.event.WhichOneof("kind") == "done":
            done = response.event.done
    return done


def test_a_replica_dying_before_the_first_token_is_replaced_once(two_replicas):
    stub, service, replicas = two_replicas
    dead, alive = replicas
    service.router.note_served(dead.address, preamble_key())   # prefix locality: the router's favourite
    assert service.router.choose(preamble_key()).address == dead.address
    assert ask(stub).replica == dead.address     # its chat format is now cached: the failure comes mid-stream
    dead.stop()
    done = ask(stub)
    assert done is not None and done.answer
    assert done.replica == alive.address


def test_no_replica_left_is_unavailable(two_replicas):
    stub, _, replicas = two_replicas
    for replica in replicas:
        replica.stop()
    with pytest.raises(grpc.RpcError) as err:
        ask(stub)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
