"""A session is the tenant's that created it (orchestrator/sessions_servicer.py, tenancy.py's `may_read`):
another tenant's key gets NOT_FOUND on it with the text an unknown id gets, ListSessions lists the caller's
tenant's sessions alone, an admin tenant and the operator (the stack's own key naming no tenant) reach every
session, and a session from before tenants (no tenant in its directory entry) is the operator's and admins'
alone. A rebuild on another replica keeps the tenant (the new replica's copy is the owner's, even when the
call that found the replica lost was the operator's), and another orchestrator over the same Redis holds
to it too.

Real parts: a private Redis, two fp32 replicas, orchestrators with a tenants file, all on loopback."""

from __future__ import annotations

import grpc
import pytest
import redis

from protos import common_pb2, sessions_pb2, sessions_pb2_grpc
from servicekit.auth import bearer_metadata
from servicekit.tenants import parse_tenants
from tests.support.inference import RunningInference
from tests.support.orchestrator import RunningOrchestrator
from tests.support.redis_server import PrivateRedis

STACK_KEY = "sk-owners-stack-own"
TENANTS = parse_tenants("""
[tenants.acme]
keys = ["sk-acme"]
weight = 2

[tenants.lab]
keys = ["sk-lab"]

[tenants.ops]
keys = ["sk-ops"]
admin = true
""", own_keys=[STACK_KEY])
ACME, LAB, OPS, OPERATOR = (bearer_metadata(k) for k in ("sk-acme", "sk-lab", "sk-ops", STACK_KEY))


@pytest.fixture
def world(embedded_model_dir, tmp_path):
    """(orchestrator, replicas, redis client, redis url). The router refreshes its stats rarely, so it keeps
    trusting a replica that just stopped (the call to it fails, and the session is rebuilt)."""
    parts: list = []
    try:
        private = PrivateRedis(tmp_path)
        parts.append(private)
        replicas = [RunningInference(embedded_model_dir, kv_device_blocks=128, token_budget=256) for _ in range(2)]
        parts.extend(replicas)
        orchestrator = RunningOrchestrator(private.url, [r.address for r in replicas], tenants=TENANTS,
                                           router_refresh_s=3600)
        parts.append(orchestrator)
        yield orchestrator, replicas, redis.Redis.from_url(private.url, decode_responses=True), private.url
    finally:
        for part in reversed(parts):
            part.stop()


def create(stub, session_id: str, key) -> sessions_pb2.SessionInfo:
    return stub.CreateSession(sessions_pb2.CreateSessionRequest(session_id=session_id, instructions="Be brief."),
                              timeout=120, metadata=key).session


def ingest(stub, session_id: str, key, *texts: str) -> sessions_pb2.IngestResponse:
    return stub.Ingest(iter([sessions_pb2.IngestRequest(session_id=session_id, segments=[
        common_pb2.Segment(text=t) for t in texts])]), timeout=120, metadata=key)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


def every_call(stub, session_id: str, key) -> dict[str, grpc.RpcError]:
    """Each Sessions call on `session_id` by `key`, and how it was refused."""
    calls = {
        "DescribeSession": lambda: stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=session_id),
                                                        timeout=60, metadata=key),
        "Ingest": lambda: ingest(stub, session_id, key, "a line from someone else"),
        "Query": lambda: list(stub.Query(sessions_pb2.QueryRequest(
            session_id=session_id, question="What is in the data?", sampling=common_pb2.SamplingParams(max_tokens=2)),
            timeout=120, metadata=key)),
        "RegisterFlashQuery": lambda: stub.RegisterFlashQuery(sessions_pb2.RegisterFlashQueryRequest(
            session_id=session_id, question="Anything new?"), timeout=60, metadata=key),
        "UnregisterFlashQuery": lambda: stub.UnregisterFlashQuery(sessions_pb2.UnregisterFlashQueryRequest(
            session_id=session_id, question="Anything new?"), timeout=60, metadata=key),
        "Subscribe": lambda: next(iter(stub.Subscribe(sessions_pb2.SubscribeRequest(session_id=session_id),
                                                      timeout=60, metadata=key))),
        "CloseSession": lambda: stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id=session_id),
                                                  timeout=60, metadata=key),
    }
    return {name: refused(call) for name, call in calls.items()}


def listed(stub, key) -> list[str]:
    return sorted(s.session_id for s in stub.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=60,
                                                          metadata=key).sessions)


def test_another_tenants_session_answers_as_an_unknown_one_and_lists_show_the_callers_own(world):
    orchestrator, replicas, r, _ = world
    stub = sessions_pb2_grpc.SessionsStub(orchestrator.channel)
    create(stub, "acme-s", ACME)
    ingest(stub, "acme-s", ACME, "09:00 web-1 started")
    create(stub, "lab-s", LAB)
    assert r.hget("streamrag:session:acme-s", "tenant") == "acme"
    assert r.hget("streamrag:session:lab-s", "tenant") == "lab"

    hidden, unknown = every_call(stub, "acme-s", LAB), every_call(stub, "no-such-session", LAB)
    for name, error in hidden.items():
        assert error.code() == unknown[name].code() == grpc.StatusCode.NOT_FOUND, (name, error)
        assert error.details() == "no session 'acme-s'", (name, error.details())
        assert unknown[name].details() == "no session 'no-such-session'", name

    # nothing lab tried reached acme's session: it is whole, on its replica, and acme's calls go on
    info = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="acme-s"), timeout=60,
                                metadata=ACME).session
    assert info.data_version == 1 and not info.flash_questions and info.state != "closed"
    assert sum(replica.stats().num_sessions for replica in replicas) == 2

    assert listed(stub, ACME) == ["acme-s"] and listed(stub, LAB) == ["lab-s"]
    assert listed(stub, OPS) == listed(stub, OPERATOR) == ["acme-s", "lab-s"]      # admin, operator: every one
    for key in (OPS, OPERATOR):
        assert stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="acme-s"), timeout=60,
                                    metadata=key).session.data_version == 1

    # a session from before tenants (no tenant recorded) is no tenant's: the operator and admins reach it
    r.hdel("streamrag:session:lab-s", "tenant")
    assert refused(lambda: stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="lab-s"), timeout=60,
                                                metadata=LAB)).code() == grpc.StatusCode.NOT_FOUND
    assert listed(stub, LAB) == [] and listed(stub, OPERATOR) == ["acme-s", "lab-s"]
    assert stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id="lab-s"), timeout=60,
                             metadata=OPS).session.state == "closed"


def test_a_rebuild_keeps_the_sessions_tenant_on_the_new_replica_and_for_every_orchestrator(world):
    orchestrator, replicas, r, redis_url = world
    stub = sessions_pb2_grpc.SessionsStub(orchestrator.channel)
    old = create(stub, "moving", ACME).replica
    ingest(stub, "moving", ACME, "09:00 web-1 started", "09:05 db-1 lag 3 s")
    holder = next(replica for replica in replicas if replica.address == old)
    other = next(replica for replica in replicas if replica is not holder)
    assert holder.service.sessions.sessions["moving"].share.tenant == "acme"
    holder.stop()

    # the operator's call finds the replica lost: the session is rebuilt as acme's, not the operator's
    info = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="moving"), timeout=300,
                                metadata=OPERATOR).session
    assert info.replica == other.address and info.data_version == 1 and info.segments == 2
    rebuilt = other.service.sessions.sessions["moving"]
    assert (rebuilt.share.tenant, rebuilt.share.weight) == ("acme", 2.0)
    assert r.hget("streamrag:session:moving", "tenant") == "acme"
    assert r.hget("streamrag:session:moving", "replica") == other.address

    second = RunningOrchestrator(redis_url, [other.address], tenants=TENANTS)
    try:
        stub2 = sessions_pb2_grpc.SessionsStub(second.channel)
        error = refused(lambda: stub2.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="moving"),
                                                      timeout=60, metadata=LAB))
        assert error.code() == grpc.StatusCode.NOT_FOUND and error.details() == "no session 'moving'"
        assert listed(stub2, LAB) == [] and listed(stub2, ACME) == ["moving"]
        assert ingest(stub2, "moving", ACME, "09:10 web-2 started").data_version == 2
    finally:
        second.stop()
