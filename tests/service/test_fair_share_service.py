"""Fair share on a real replica (fp32 SmolLM2) over gRPC: a flooding tenant's backlog does not hold a
light tenant's requests back (the order the engine admits them in: no clock), and the tenant named by
an orchestrator reaches the replica and its scheduler."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from protos import inference_pb2, inference_pb2_grpc
from protos.metadata import identity_metadata
from servicekit.tenants import parse_tenants
from tests.support.inference import RunningInference
from tests.support.orchestrator import RunningOrchestrator
from tests.support.redis_server import PrivateRedis


@pytest.fixture(scope="module", params=[True, False], ids=["fair", "fcfs"])
def replica(request, embedded_model_dir):
    running = RunningInference(embedded_model_dir, policy="fcfs", max_running=1, kv_device_blocks=128,
                               policy_options={"fair_share": request.param})
    yield running, request.param
    running.stop()


def _admissions(running) -> list[str]:
    """The ids of the requests the engine admits, in order, from now on."""
    scheduler = running.service.engine.scheduler
    schedule, admitted = scheduler.schedule, []

    def recording(drafts=None):
        out = schedule(drafts)
        admitted.extend(r.request_id for r in out.newly_scheduled)
        return out

    scheduler.schedule = recording
    return admitted


def _queued(running, count: int) -> None:
    """Wait until `count` commands wait for the held engine thread (each request's open is one)."""
    while running.service.thread._commands.qsize() < count:
        threading.Event().wait(0.01)


def test_a_flood_does_not_hold_the_light_tenants_requests_behind_its_backlog(replica):
    running, fair = replica
    admitted = _admissions(running)
    release = threading.Event()
    running.service.thread.post(lambda engine: release.wait(120))   # hold the engine: everything queues

    def generate(rid: str, tenant: str) -> None:
        request = inference_pb2.GenerateRequest(request_id=rid, segments=[{"text": f"Tell me about {rid}."}],
                                                sampling={"max_tokens": 4})
        list(running.stub.Generate(request, timeout=300, metadata=identity_metadata(tenant)))

    with ThreadPoolExecutor(8) as pool:
        futures = []
        for i in range(6):
            futures.append(pool.submit(generate, f"flood-{i}", "flood"))
            _queued(running, i + 1)              # in this order
        for i in range(2):
            futures.append(pool.submit(generate, f"light-{i}", "light"))
            _queued(running, 6 + i + 1)
        release.set()
        for future in futures:
            future.result()
    order = list(dict.fromkeys(admitted))        # first admission of each (a preempted one comes back)
    assert sorted(order) == sorted([f"flood-{i}" for i in range(6)] + ["light-0", "light-1"])
    before_last_light = order[:order.index("light-1")]
    floods_first = sum(rid.startswith("flood") for rid in before_last_light)
    if fair:
        # the light tenant's requests are admitted as the running one ends, ahead of the flood's backlog
        assert order[0] == "flood-0" and order[1] == "light-0" and "light-1" in order[2:4]
    else:
        assert floods_first == 6                 # plain FCFS: the whole flood first
    running.wait_until_all_blocks_free()


def test_the_tenant_an_orchestrator_serves_reaches_the_replicas_counters(replica, tmp_path):
    running, fair = replica
    if not fair:
        pytest.skip("the replica counts tenants only with fair share on")
    redis = PrivateRedis(tmp_path)
    tenants = parse_tenants('[tenants.team-x]\nkeys = ["x-key"]\nweight = 2\n')
    orchestrator = RunningOrchestrator(redis.url, [running.address], tenants=tenants)
    try:
        stub = inference_pb2_grpc.InferenceStub(orchestrator.channel)
        request = inference_pb2.GenerateRequest(segments=[{"text": "Hello"}], sampling={"max_tokens": 2})
        list(stub.Generate(request, timeout=300, metadata=(("authorization", "Bearer x-key"),)))
        counters = running.service.engine.policy.counters
        assert counters.counter("team-x") > 0
    finally:
        orchestrator.stop()
        redis.stop()
