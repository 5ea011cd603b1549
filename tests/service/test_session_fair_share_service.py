"""Fair share over the Sessions service on a real replica (fp32 SmolLM2) over gRPC: the tenant each
Sessions call names (`protos.metadata`, as an orchestrator sends it) reaches the engine, which charges a
session's ingestion to the tenant that created it and a query to the tenant that asks it, and ranks a
light tenant's session queries ahead of a flood's backlog of Generate requests (the order the engine
admits them in: no clock). A malformed tenant is INVALID_ARGUMENT, as on Generate."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from protos import common_pb2, inference_pb2, sessions_pb2, sessions_pb2_grpc
from protos.metadata import TENANT_KEY, TENANT_WEIGHT_KEY, identity_metadata
from tests.service.test_fair_share_service import _admissions, _queued
from tests.support.inference import RunningInference


@pytest.fixture(scope="module", params=[True, False], ids=["fair", "fcfs"])
def replica(request, embedded_model_dir):
    running = RunningInference(embedded_model_dir, policy="fcfs", max_running=1, kv_device_blocks=128,
                               policy_options={"fair_share": request.param})
    yield running, sessions_pb2_grpc.SessionsStub(running.channel), request.param
    running.stop()


def open_session(sessions, session_id: str, tenant: str, weight: float = 1.0) -> None:
    """A session of `tenant`, its data ingested and prefilled (a query asking for version 1 has run)."""
    who = identity_metadata(tenant, weight)
    sessions.CreateSession(sessions_pb2.CreateSessionRequest(session_id=session_id, instructions="Answer briefly."),
                           timeout=120, metadata=who)
    sessions.Ingest(iter([sessions_pb2.IngestRequest(session_id=session_id, segments=[
        common_pb2.Segment(text="09:00 web-1 started, version 2.4.1")])]), timeout=120, metadata=who)
    ask(sessions, session_id, f"{session_id}-warm", tenant, min_data_version=1)


def ask(sessions, session_id: str, request_id: str, tenant: str, min_data_version: int = 0) -> None:
    responses = list(sessions.Query(sessions_pb2.QueryRequest(
        session_id=session_id, question="Which version started?", request_id=request_id,
        min_data_version=min_data_version, sampling=common_pb2.SamplingParams(max_tokens=4)),
        timeout=300, metadata=identity_metadata(tenant)))
    assert responses[-1].WhichOneof("kind") == "done"


def test_ingestion_is_charged_to_the_sessions_tenant_and_a_query_to_its_askers(replica):
    running, sessions, fair = replica
    if not fair:
        pytest.skip("the replica counts tenants only with fair share on")
    open_session(sessions, "owned", "owner", weight=2.0)
    engine = running.service.engine
    assert running.service.sessions.sessions["owned"].share.tenant == "owner"
    counters = engine.policy.counters
    owner_before, asker_before = counters.counter("owner"), counters.counter("asker")
    ask(sessions, "owned", "asked-by-another", "asker")
    assert counters.counter("owner") == owner_before        # the query is not the session's tenant's
    assert counters.counter("asker") > asker_before
    assert owner_before > 0
    sessions.CloseSession(sessions_pb2.CloseSessionRequest(session_id="owned"), timeout=60)
    running.wait_until_all_blocks_free()


def test_a_malformed_tenant_on_a_sessions_call_is_invalid_argument(replica):
    _, sessions, _ = replica
    bad = ((TENANT_KEY, "owner"), (TENANT_WEIGHT_KEY, "heavy"))
    with pytest.raises(grpc.RpcError) as raised:
        sessions.CreateSession(sessions_pb2.CreateSessionRequest(session_id="bad-weight", instructions="x"),
                               timeout=60, metadata=bad)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and TENANT_WEIGHT_KEY in raised.value.details()


def test_a_flood_does_not_hold_a_light_tenants_session_queries_behind_its_backlog(replica):
    running, sessions, fair = replica
    open_session(sessions, "light-log", "light")
    admitted = _admissions(running)
    release = threading.Event()
    running.service.thread.post(lambda engine: release.wait(120))   # hold the engine: everything queues

    def generate(rid: str) -> None:
        request = inference_pb2.GenerateRequest(request_id=rid, segments=[{"text": f"Tell me about {rid}."}],
                                                sampling={"max_tokens": 4})
        list(running.stub.Generate(request, timeout=300, metadata=identity_metadata("flood")))

    with ThreadPoolExecutor(8) as pool:
        futures = []
        for i in range(6):
            futures.append(pool.submit(generate, f"flood-{i}"))
            _queued(running, i + 1)              # in this order
        for i in range(2):                       # a query's plan (its fork) is one command on the engine thread
            futures.append(pool.submit(ask, sessions, "light-log", f"light-{i}", "light"))
            _queued(running, 6 + i + 1)
        release.set()
        for future in futures:
            future.result()
    order = [rid for rid in dict.fromkeys(admitted) if rid.startswith(("flood", "light"))]
    assert sorted(order) == sorted([f"flood-{i}" for i in range(6)] + ["light-0", "light-1"])
    floods_before_last_light = sum(rid.startswith("flood") for rid in order[:order.index("light-1")])
    if fair:
        # the light tenant's queries are admitted as the running request ends, ahead of the flood's backlog
        assert floods_before_last_light <= 2, order
    else:
        assert floods_before_last_light == 6, order    # plain FCFS: the whole flood first
    sessions.CloseSession(sessions_pb2.CloseSessionRequest(session_id="light-log"), timeout=60)
    running.wait_until_all_blocks_free()
