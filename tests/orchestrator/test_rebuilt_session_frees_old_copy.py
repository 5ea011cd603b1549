"""A session rebuilt away from a replica that stopped answering (SIGSTOP, its socket still open)
leaves no copy behind: once that replica answers again (SIGCONT), the orchestrator closes the old
copy there and every one of its KV blocks is free. Real processes on loopback: two replicas as
`streamrag serve` subprocesses, a private redis-server, the orchestrator in this process; no
timing asserts (every wait is a bound)."""

from __future__ import annotations

import signal

import grpc
import pytest

from protos import common_pb2, inference_pb2, inference_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from tests.orchestrator.test_routing_follows_health import serving, started_replicas, stopper, until
from tests.support.orchestrator import RunningOrchestrator
from tests.support.redis_server import PrivateRedis

__all__ = ["stopper"]        # the fixture, used below

SEGMENTS = [f"Note {i}: the quarterly report lists revenue by region, costs by team and a forecast." for i in range(6)]


def engine_stats(address: str) -> inference_pb2.EngineStats:
    with grpc.insecure_channel(address) as channel:
        return inference_pb2_grpc.InferenceStub(channel).GetStats(inference_pb2.GetStatsRequest(), timeout=10).stats


def all_free(stats: inference_pb2.EngineStats) -> bool:
    return stats.num_sessions == 0 and all(p.free_blocks == p.total_blocks for p in stats.pools)


@pytest.mark.timeout(900)   # replicas load a model at every start
@pytest.mark.slow   # half a minute (`bash scripts/test.sh --run-slow`)
def test_a_session_rebuilt_after_sigstop_is_closed_on_the_old_replica_once_it_resumes(embedded_model_dir,
                                                                                     tmp_path, stopper):
    redis_server = PrivateRedis(tmp_path)
    stopper.append(redis_server)
    replicas = started_replicas(embedded_model_dir, stopper)
    orchestrator = RunningOrchestrator(redis_server.url, list(replicas), {})
    stopper.append(orchestrator)
    sessions = sessions_pb2_grpc.SessionsStub(orchestrator.channel)

    created = sessions.CreateSession(sessions_pb2.CreateSessionRequest(
        session_id="orphan-check", instructions="Answer from the notes."), timeout=120).session
    old = created.replica
    sessions.Ingest(iter([sessions_pb2.IngestRequest(session_id="orphan-check", segments=[
        common_pb2.Segment(text=t)]) for t in SEGMENTS]), timeout=120)
    until(lambda: (s := engine_stats(old)).num_sessions == 1 and s.pools[0].free_blocks < s.pools[0].total_blocks,
          "the session's KV on its replica")

    replicas[old].signal(signal.SIGSTOP)
    try:   # the call to the frozen replica breaks (keepalive), the session is rebuilt on the other
        described = sessions.DescribeSession(sessions_pb2.DescribeSessionRequest(session_id="orphan-check"),
                                             timeout=300).session
    finally:
        replicas[old].signal(signal.SIGCONT)
    assert described.replica != old and described.replica in replicas
    assert described.segments == len(SEGMENTS)
    until(lambda: serving(old), "the stopped replica serving again after SIGCONT")
    until(lambda: all_free(engine_stats(old)), "every KV block of the old replica free again", 300)
    assert engine_stats(described.replica).num_sessions == 1        # the rebuilt one is untouched
    sessions.CloseSession(sessions_pb2.CloseSessionRequest(session_id="orphan-check"), timeout=60)
