"""An Ask through the orchestrator on a prefill replica and a decode replica: the router pairs them,
the answer equals one colocated replica's, and the hand-off is in the lifecycle stored in Redis."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from orchestrator.server import OrchestratorService
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.config import ServiceConfig
from tests.disagg.conftest import RunningReplica
from tests.support.redis_server import PrivateRedis

NONE = orchestrator_pb2.RETRIEVER_CHOICE_NONE


@pytest.fixture
def pair_stack(embedded_model_dir, tmp_path):
    redis = PrivateRedis(tmp_path)
    replicas: list[RunningReplica] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    service = channel = None

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(120)

    async def start():
        orchestrator = OrchestratorService(ServiceConfig("orchestrator", port=0, metrics_port=None, grace_s=0),
                                           redis_url=redis.url, inference=[r.address for r in replicas],
                                           retrievers={}, router_refresh_s=0.2)
        return orchestrator, await orchestrator.start(handle_signals=False)

    try:
        replicas.extend(RunningReplica(embedded_model_dir, role=role, kv_device_blocks=128, token_budget=256)
                        for role in ("decode", "prefill"))      # the decode replica first: pairing must skip it
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


def ask(stub, request_id, no_stream=False):
    done = None
    for response in stub.Ask(orchestrator_pb2.AskRequest(question="What is the capital of France?", retriever=NONE,
                                                         max_tokens=16, request_id=request_id, no_stream=no_stream),
                             timeout=120):
        if response.event.WhichOneof("kind") == "done":
            done = response.event.done
    return done


def test_a_paired_ask_hands_off_and_records_it(pair_stack):
    stub, service, (decode, prefill) = pair_stack
    deadline = time.monotonic() + 60
    while not all(r.stats is not None and r.stats.role for r in service.router.replicas):
        assert time.monotonic() < deadline, "the router never saw the roles"
        time.sleep(0.1)
    baseline = ask(stub, "colocated", no_stream=True)       # Generate: always colocated
    calls = decode.service.kv_transfer.calls
    done = ask(stub, "paired")
    assert done.replica == prefill.address                   # the prefill side answers the call ...
    assert decode.service.kv_transfer.calls == calls + 1     # ... decoded on the decode side
    assert done.answer == baseline.answer
    record = stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id="paired"), timeout=30).record
    kinds = [event.kind for event in record.events]
    assert "KV_TRANSFER_START" in kinds and "KV_HANDOFF" in kinds and "KV_TRANSFER_FALLBACK" not in kinds
    assert kinds.index("KV_HANDOFF") < kinds.index("FIRST_TOKEN")
    handoff = next(e for e in record.events if e.kind == "KV_HANDOFF")
    assert int(handoff.fields["count"]) > 0 and "after the last input" in handoff.fields["detail"]
    prefill.wait_until_all_blocks_free()
    decode.wait_until_all_blocks_free()
