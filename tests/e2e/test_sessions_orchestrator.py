"""Sessions through the orchestrator: calls reach the replica that holds the session, the
directory and lifecycle records land in Redis, and a session whose replica dies is rebuilt on
the other replica from the retained data, answering exactly as before."""

from __future__ import annotations

import time

import grpc
import pytest
import redis

from protos import common_pb2, orchestrator_pb2, orchestrator_pb2_grpc, sessions_pb2, sessions_pb2_grpc

INSTRUCTIONS = "You answer questions about the server log below. Answer briefly."
LOG = ["09:00 web-1 started, version 2.4.1", "09:05 web-1 health check ok",
       "09:10 db-1 replication lag 3 s", "09:15 web-2 started, version 2.4.2"]
QUESTION = "Which version did web-2 start with?"


def ingest(stub, session_id, *batches):
    return stub.Ingest(iter([sessions_pb2.IngestRequest(session_id=session_id, segments=[
        common_pb2.Segment(text=t) for t in batch]) for batch in batches]), timeout=120)


def query(stub, session_id, question=QUESTION, min_data_version=2):
    """Asks for every ingested batch (version 2: both batches of LOG), prefilled or not."""
    started = done = None
    for response in stub.Query(sessions_pb2.QueryRequest(
            session_id=session_id, question=question, request_id=f"q-{time.monotonic_ns()}",
            min_data_version=min_data_version,
            sampling=common_pb2.SamplingParams(max_tokens=8)), timeout=300):
        kind = response.WhichOneof("kind")
        if kind == "started":
            started = response.started
        elif kind == "done":
            done = response.done
    return started, done


@pytest.fixture
def sessions(two_replicas):
    _, service, replicas, channel, private_redis = two_replicas
    stub = sessions_pb2_grpc.SessionsStub(channel)
    stub.CreateSession(sessions_pb2.CreateSessionRequest(session_id="log", instructions=INSTRUCTIONS), timeout=120)
    return stub, service, replicas, channel, redis.Redis.from_url(private_redis.url, decode_responses=True)


def test_calls_go_to_the_replica_holding_the_session_and_are_recorded_in_redis(sessions):
    stub, _, replicas, channel, r = sessions
    ingest(stub, "log", LOG[:2], LOG[2:])
    info = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="log"), timeout=60).session
    holder = next(replica for replica in replicas if replica.address == info.replica)
    assert holder.stats().num_sessions == 1 and info.data_version == 2
    _, done = query(stub, "log")
    assert done.text and done.data_version == 2
    assert r.hget("streamrag:session:log", "replica") == info.replica
    assert r.llen("streamrag:session:log:batches") == 2
    kinds = [fields["kind"] for _, fields in r.xrange("streamrag:req:session:log:events")]
    assert kinds[:2] == ["CREATED", "INGESTED"]
    record = orchestrator_pb2_grpc.OrchestratorStub(channel).GetRequest(
        orchestrator_pb2.GetRequestRequest(request_id=r.zrange("streamrag:requests:recent", -1, -1)[0]),
        timeout=30).record
    assert record.answer == done.text
    listed = stub.ListSessions(sessions_pb2.ListSessionsRequest(), timeout=60).sessions
    assert [(s.session_id, s.replica) for s in listed] == [("log", info.replica)]
    closed = stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id="log"), timeout=60).session
    assert closed.state == "closed" and not r.exists("streamrag:session:log")
    with pytest.raises(grpc.RpcError) as caught:
        query(stub, "log", min_data_version=0)
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


def test_a_session_whose_replica_dies_is_rebuilt_on_the_other_replica(sessions):
    stub, _, replicas, _, r = sessions
    ingest(stub, "log", LOG[:2], LOG[2:])
    stub.RegisterFlashQuery(sessions_pb2.RegisterFlashQueryRequest(session_id="log", question="Is db-1 lagging?",
                                                           max_tokens=4), timeout=60)
    _, before = query(stub, "log")
    lost = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="log"), timeout=60).session.replica
    next(replica for replica in replicas if replica.address == lost).stop()
    started, after = query(stub, "log")
    assert after.text == before.text and started.data_version == after.data_version == 2
    info = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="log"), timeout=60).session
    assert info.replica != lost and list(info.flash_questions) == ["Is db-1 lagging?"]
    rebuilt = [fields for _, fields in r.xrange("streamrag:req:session:log:events") if fields["kind"] == "REBUILT"]
    assert rebuilt and rebuilt[0]["lost"] == lost
    assert ingest(stub, "log", ["09:20 web-1 stopped"]).data_version == 3


def test_with_no_replica_left_a_session_call_is_unavailable_and_names_the_lost_replica(sessions):
    stub, _, replicas, _, _ = sessions
    holder = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="log"), timeout=60).session.replica
    for replica in replicas:
        replica.stop()
    with pytest.raises(grpc.RpcError) as caught:
        query(stub, "log", min_data_version=0)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE and holder in caught.value.details()
