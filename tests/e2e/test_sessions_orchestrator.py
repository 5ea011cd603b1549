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


def record_of(channel, request_id):
    """The stored record (GetRequest, as `streamrag requests ID` reads it) once the request has ended."""
    stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
    deadline = time.monotonic() + 10
    while True:
        record = stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=request_id), timeout=30).record
        if record.state >= orchestrator_pb2.REQUEST_STATE_FINISHED or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


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
    stub, _, replicas, channel, r = sessions
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
    moved = record_of(channel, r.zrange("streamrag:requests:recent", -1, -1)[0])      # the query that moved
    assert moved.replica == info.replica and [e.kind for e in moved.events][-1] == "DONE"
    errors = [e.fields["detail"] for e in moved.events if e.kind == "ERROR"]
    assert len(errors) == 1 and lost in errors[0] and errors[0].endswith(f"session rebuilt, retrying on {info.replica}")
    assert ingest(stub, "log", ["09:20 web-1 stopped"]).data_version == 3


def test_a_query_is_recorded_with_the_event_names_of_an_ask(sessions):
    """DONE at the end of an answer (never FINISHED), ERROR before FAILED, as an Ask's record has them."""
    stub, _, _, channel, _ = sessions
    orchestrator = orchestrator_pb2_grpc.OrchestratorStub(channel)
    ingest(stub, "log", LOG)
    sampling = common_pb2.SamplingParams(max_tokens=4)
    list(stub.Query(sessions_pb2.QueryRequest(session_id="log", question=QUESTION, request_id="q-answered",
                                              sampling=sampling), timeout=300))
    list(orchestrator.Ask(orchestrator_pb2.AskRequest(
        question=QUESTION, request_id="ask-answered", retriever=orchestrator_pb2.RETRIEVER_CHOICE_NONE,
        max_tokens=4), timeout=300))
    answered = {rid: orchestrator.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=rid), timeout=30).record
                for rid in ("q-answered", "ask-answered")}
    for record in answered.values():
        kinds = [e.kind for e in record.events]
        assert record.state == orchestrator_pb2.REQUEST_STATE_FINISHED and kinds[-1] == "DONE", kinds
        assert record.answer
    assert "FINISHED" not in [e.kind for e in answered["q-answered"].events]    # the engine's, on an Ask only
    done = answered["q-answered"].events[-1].fields
    assert set(done) >= {"ttft_from_question_s", "total_s", "flash_hit", "data_version"}
    assert answered["q-answered"].stats.prompt_tokens > 0

    with pytest.raises(grpc.RpcError) as caught:    # the replica refuses it: the query fails as it says
        list(stub.Query(sessions_pb2.QueryRequest(session_id="log", question=QUESTION, request_id="q-refused",
                                                  sampling=common_pb2.SamplingParams(max_tokens=4, temperature=-1)),
                        timeout=300))
    failed = orchestrator.GetRequest(orchestrator_pb2.GetRequestRequest(request_id="q-refused"), timeout=30).record
    assert failed.state == orchestrator_pb2.REQUEST_STATE_FAILED and failed.error == caught.value.details()
    assert [e.kind for e in failed.events][-1] == "ERROR" and failed.events[-1].fields["detail"] == failed.error


def test_with_no_replica_left_a_session_call_is_unavailable_and_names_the_lost_replica(sessions):
    stub, _, replicas, channel, r = sessions
    holder = stub.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="log"), timeout=60).session.replica
    for replica in replicas:
        replica.stop()
    with pytest.raises(grpc.RpcError) as caught:
        query(stub, "log", min_data_version=0)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE and holder in caught.value.details()
    failed = record_of(channel, r.zrange("streamrag:requests:recent", -1, -1)[0])
    assert failed.state == orchestrator_pb2.REQUEST_STATE_FAILED and failed.error == caught.value.details()
    assert [e.kind for e in failed.events][-1] == "ERROR" and failed.events[-1].fields["detail"] == failed.error
