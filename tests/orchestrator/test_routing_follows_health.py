"""Routing follows health: a replica, retriever or Redis that is killed and started again on its
port is used by the very next Ask, and a replica that stops answering mid-Ask (SIGSTOP, its socket
still open) is failed over within the Ask's deadline. Real processes on loopback: replicas and a
replay retriever as `streamrag serve` subprocesses, a private redis-server, the orchestrator in
this process; no timing asserts (every wait below is a bound, not a measure)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.lifecycle_store import REDIS_GAP, events_key, request_key
from protos import common_pb2, orchestrator_pb2
from retriever_svc.replay.trace import TraceChunk, TraceDocument, TraceQuery, write_trace
from servicekit.health import check_health
from tests.support.inference import InferenceProcess
from tests.support.orchestrator import RunningOrchestrator
from tests.support.redis_server import PrivateRedis
from tests.support.retrievers import RetrieverProcess

NONE = orchestrator_pb2.RETRIEVER_CHOICE_NONE
REPLAY = orchestrator_pb2.RETRIEVER_CHOICE_REPLAY
QUESTION = "How do I read a file line by line?"
ROUNDS = 3
ASK_DEADLINE_S = 120

# The replay retriever's stream: one passage now, the last one 2 s later, so the prompt is still
# open (no token yet) for a moment after the Ask starts.
TRACE = (TraceQuery("files", QUESTION, "crawler", "synthesized", (
    TraceChunk(0.0, "append", False, (TraceDocument("f1", "Files", "http://x/files.html",
                                                    "Iterate over the file object: for line in f."),)),
    TraceChunk(2.0, "append", True, (TraceDocument("f2", "Input and output", "http://x/io.html",
                                                   "open() returns a file object; readline() reads one line."),)),
)),)


def until(condition: Callable[[], object], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


def serving(address: str) -> bool:
    return check_health("grpc", address, timeout_s=2.0) is None


def a_replica(model_dir: Path) -> InferenceProcess:
    """An inference replica as its own process on a port fixed for its life: `kill()`, then `start()` there."""
    return InferenceProcess(model_dir, max_streams=8,
                            extra_args=["--kv-device-blocks", "128", "--max-model-len", "2048"])


def replay_retriever(trace: Path) -> RetrieverProcess:
    """The replay retriever as its own process on a port fixed for its life: `kill()`, then `start()` there."""
    return RetrieverProcess("replay", trace.with_suffix(".log"), "--trace", str(trace))


def ask(orchestrator: RunningOrchestrator, retriever: int = NONE,
        on_started: Callable[[str], None] | None = None) -> tuple[list, object]:
    """Every event of one Ask, and its `done` (the Ask carries a deadline: it cannot hang)."""
    events = []
    request = orchestrator_pb2.AskRequest(question=QUESTION, retriever=retriever, max_tokens=8)
    for response in orchestrator.stub.Ask(request, timeout=ASK_DEADLINE_S):
        event = response.event
        events.append(event)
        if event.WhichOneof("kind") == "started" and on_started is not None:
            on_started(event.started.replica)
    assert events and events[-1].WhichOneof("kind") == "done", events
    return events, events[-1].done


@pytest.fixture
def stopper() -> Iterator[list]:
    """Everything a test starts goes here and is stopped, even when set-up fails half-way."""
    parts: list = []
    yield parts
    for part in reversed(parts):
        part.stop()


def started_replicas(model_dir: Path, stopper: list, count: int = 2) -> dict[str, InferenceProcess]:
    """`count` replicas, each handed to `stopper` as soon as it runs, by address."""
    replicas = {}
    for _ in range(count):
        running = a_replica(model_dir)
        stopper.append(running)
        replicas[running.address] = running
    return replicas


def errors(events: list) -> list[str]:
    return [e.lifecycle.detail for e in events
            if e.WhichOneof("kind") == "lifecycle" and e.lifecycle.kind == common_pb2.LIFECYCLE_EVENT_KIND_ERROR]


@pytest.mark.timeout(900)   # replicas load a model at every start
@pytest.mark.slow   # about a minute of kills and restarts (`bash scripts/test.sh --run-slow`)
def test_a_replica_killed_and_started_again_serves_the_next_ask_every_time(embedded_model_dir, tmp_path, stopper):
    redis_server = PrivateRedis(tmp_path)
    stopper.append(redis_server)
    replica = a_replica(embedded_model_dir)
    stopper.append(replica)
    orchestrator = RunningOrchestrator(redis_server.url, [replica.address], {})
    stopper.append(orchestrator)
    _, before = ask(orchestrator)
    for _ in range(ROUNDS):
        replica.kill()
        replica.start()                  # same port; returns once its health says SERVING
        _, done = ask(orchestrator)     # at once
        assert done.replica == replica.address
        assert done.answer == before.answer


@pytest.mark.timeout(900)   # replicas load a model at every start
@pytest.mark.slow   # about a minute of kills and restarts (`bash scripts/test.sh --run-slow`)
def test_a_retriever_killed_and_started_again_serves_the_next_ask_every_time(embedded_model_dir, tmp_path,
                                                                             stopper):
    redis_server = PrivateRedis(tmp_path)
    stopper.append(redis_server)
    retriever = replay_retriever(write_trace(tmp_path / "trace.jsonl", TRACE))
    stopper.append(retriever)
    replica = a_replica(embedded_model_dir)
    stopper.append(replica)
    orchestrator = RunningOrchestrator(redis_server.url, [replica.address], {"replay": retriever.address})
    stopper.append(orchestrator)
    _, before = ask(orchestrator, REPLAY)
    assert [d.id for d in before.sources] == ["f1", "f2"]
    for _ in range(ROUNDS):
        retriever.kill()
        events, during = ask(orchestrator, REPLAY)     # answered without it; its channel now backs off
        assert errors(events) and not during.sources
        retriever.start()                # same port; returns once its health says SERVING
        events, done = ask(orchestrator, REPLAY)       # at once
        assert errors(events) == []      # no "retriever replay: ..." ERROR: it was used
        assert [d.id for d in done.sources] == ["f1", "f2"]
        assert done.answer == before.answer


@pytest.mark.timeout(900)   # replicas load a model at every start
def test_redis_killed_and_started_again_keeps_every_record_and_serves_the_next_ask(embedded_model_dir, tmp_path,
                                                                                 stopper):
    redis_server = PrivateRedis(tmp_path, persist=True)          # what it acknowledged survives a restart
    stopper.append(redis_server)
    replica = a_replica(embedded_model_dir)
    stopper.append(replica)
    orchestrator = RunningOrchestrator(redis_server.url, [replica.address], {})
    stopper.append(orchestrator)
    raw = redis.Redis.from_url(redis_server.url, decode_responses=True)
    store = orchestrator.service.store
    asked = []
    for _ in range(ROUNDS):
        _, done = ask(orchestrator)
        asked.append(done.request_id)
        assert orchestrator.run(store.flush(60))                 # stored: acknowledged by Redis
        redis_server._proc.kill()                                # SIGKILL
        redis_server._proc.wait(30)
        _, during = ask(orchestrator)                           # the answer does not need Redis
        assert during.answer == done.answer
        asked.append(during.request_id)
        redis_server._start()                                    # same port and data; returns on PONG
        _, after = ask(orchestrator)                            # at once
        assert after.answer == done.answer
        asked.append(after.request_id)
        until(lambda rid=after.request_id: raw.hget(request_key(rid), "state") == "FINISHED",
              "the Ask after the restart stored in Redis", 60)
    raw.connection_pool.disconnect()
    for request_id in asked:                                     # none lost, the outage's own included
        until(lambda rid=request_id: raw.hget(request_key(rid), "state") == "FINISHED", f"{request_id} stored", 60)
    gaps = [asked[i] for i in range(1, len(asked), 3)]
    for request_id in gaps:                                      # recorded during the outage: marked
        kinds = [fields["kind"] for _, fields in raw.xrange(events_key(request_id))]
        assert REDIS_GAP in kinds and "DONE" in kinds
    record = orchestrator.stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=asked[-1]), timeout=30)
    assert record.record.state == orchestrator_pb2.REQUEST_STATE_FINISHED
    raw.close()


@pytest.mark.timeout(900)   # replicas load a model at every start
def test_a_replica_stopped_mid_ask_is_failed_over_within_the_deadline(embedded_model_dir, tmp_path, stopper):
    redis_server = PrivateRedis(tmp_path)
    stopper.append(redis_server)
    retriever = replay_retriever(write_trace(tmp_path / "trace.jsonl", TRACE))
    stopper.append(retriever)
    replicas = started_replicas(embedded_model_dir, stopper)
    orchestrator = RunningOrchestrator(redis_server.url, list(replicas), {"replay": retriever.address})
    stopper.append(orchestrator)
    _, undisturbed = ask(orchestrator, REPLAY)
    stopped: list[str] = []

    def stop_it(address: str) -> None:   # before its first token: the last passage is 2 s away
        replicas[address].signal(signal.SIGSTOP)
        stopped.append(address)

    try:
        _, done = ask(orchestrator, REPLAY, on_started=stop_it)
    finally:
        for address in stopped:
            replicas[address].signal(signal.SIGCONT)
    [lost] = stopped
    assert done.replica != lost and done.replica in replicas
    assert done.answer == undisturbed.answer                    # greedy: the same answer, token for token
    assert [d.id for d in done.sources] == ["f1", "f2"]
    record = orchestrator.stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=done.request_id),
                                          timeout=30).record
    assert any(e.kind == "ERROR" and f"replica {lost} failed" in e.fields["detail"] for e in record.events)
    until(lambda: serving(lost), "the stopped replica serving again after SIGCONT")
