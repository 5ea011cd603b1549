"""The orchestrator's Sessions service behind the tenant gate (orchestrator/sessions_servicer.py): the key
names the tenant, every call takes one of its requests (over the limit: RESOURCE_EXHAUSTED with the retry
delay in trailing metadata, another tenant unaffected), a query is recorded as the tenant's, and the tenant
goes with every call to the replica, as an Ask's does.

Real parts: Redis, one fp32 replica behind a gate that notes each Sessions call's metadata
(tests/support/inference_gate.py), an orchestrator with a tenants file."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

from protos import common_pb2, orchestrator_pb2, orchestrator_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from protos.metadata import TENANT_KEY
from servicekit.auth import bearer_metadata
from servicekit.tenants import parse_tenants
from tests.support.gated_world import gated_world
from tests.support.orchestrator import RunningOrchestrator

STACK_KEY = "sk-sessions-stack-own"
RPM = 4
TENANTS = f"""
[tenants.sess]
keys = ["sess-key"]
requests_per_minute = {RPM}

[tenants.free]
keys = ["free-key"]
"""


@pytest.fixture
def world(embedded_model_dir, tmp_path):
    with gated_world(embedded_model_dir, tmp_path) as w:
        orchestrator = w.parts.add(RunningOrchestrator(w.redis.url, [w.gate.address],
                                                       tenants=parse_tenants(TENANTS, own_keys=[STACK_KEY])))
        yield w.gate, orchestrator


def test_session_calls_are_their_tenants_requests_limited_recorded_and_named_to_the_replica(world):
    gate, orchestrator = world
    stub = sessions_pb2_grpc.SessionsStub(orchestrator.channel)
    key = bearer_metadata("sess-key")
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    stub.CreateSession(sessions_pb2.CreateSessionRequest(session_id=session_id, instructions="Answer briefly."),
                       timeout=120, metadata=key)
    stub.Ingest(iter([sessions_pb2.IngestRequest(session_id=session_id, segments=[
        common_pb2.Segment(text="09:15 web-2 started, version 2.4.2")])]), timeout=120, metadata=key)
    query_id = f"q-{uuid.uuid4().hex[:8]}"
    responses = list(stub.Query(sessions_pb2.QueryRequest(
        session_id=session_id, question="Which version did web-2 start with?", request_id=query_id,
        min_data_version=1, sampling=common_pb2.SamplingParams(max_tokens=4)), timeout=300, metadata=key))
    assert responses[-1].WhichOneof("kind") == "done"

    # the tenant went with every call to the replica
    named = {name: metadata.get(TENANT_KEY) for name, metadata in gate.calls}
    assert named.get("CreateSession") == named.get("Ingest") == named.get("Query") == "sess", gate.calls

    # the query is the tenant's record (and its key reads it)
    records = orchestrator_pb2_grpc.OrchestratorStub(orchestrator.channel)
    deadline = time.monotonic() + 60
    while True:
        try:
            record = records.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=query_id), timeout=30,
                                        metadata=key).record
            if record.tenant == "sess":
                break
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
        assert time.monotonic() < deadline, "the query was never recorded as the tenant's"
        time.sleep(0.1)

    # three of its four requests a minute taken: a fourth call goes, then its calls are refused
    for _ in range(3 * RPM):
        try:
            stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=session_id), timeout=60, metadata=key)
        except grpc.RpcError as exc:
            refused = exc
            break
    else:
        pytest.fail("the tenant's session calls were never refused")
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "requests_per_minute" in refused.details()
    trailing = dict(refused.trailing_metadata())
    assert int(trailing["retry-after"]) >= 1 and trailing["x-ratelimit-limit-requests"] == str(RPM)
    with pytest.raises(grpc.RpcError) as raised:              # a Subscribe is a request too
        next(iter(stub.Subscribe(sessions_pb2.SubscribeRequest(session_id=session_id), timeout=60, metadata=key)))
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    # another tenant's calls are unaffected (its own session; this one is not its to reach)
    free = bearer_metadata("free-key")
    other = stub.CreateSession(sessions_pb2.CreateSessionRequest(instructions="Answer briefly."), timeout=120,
                               metadata=free).session.session_id
    described = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=other), timeout=60,
                                     metadata=free)
    assert described.session.session_id == other
