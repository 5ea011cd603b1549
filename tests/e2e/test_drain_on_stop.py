"""A replica stopped with SIGTERM drains: its health says NOT_SERVING first, so the orchestrator
sends it no new ask, the answer it is streaming ends there in full, and the process exits once
that answer is done (not at the end of its grace)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from orchestrator.prompt import preamble_key
from protos import common_pb2, orchestrator_pb2
from tests.support.inference import InferenceProcess
from tests.support.orchestrator import RunningOrchestrator
from tests.support.redis_server import PrivateRedis

NONE = orchestrator_pb2.RETRIEVER_CHOICE_NONE
LONG = 48
GRACE_S = 600      # far longer than the drain: the process must not wait it out


def ask_request(max_tokens: int) -> orchestrator_pb2.AskRequest:
    return orchestrator_pb2.AskRequest(question="Tell me about the history of Paris.", retriever=NONE,
                                       max_tokens=max_tokens, sampling=common_pb2.SamplingParams(ignore_eos=True))


def wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def two_replica_processes(embedded_model_dir, tmp_path):
    redis = PrivateRedis(tmp_path)
    replicas, orchestrator = [], None
    try:
        for _ in range(2):
            replicas.append(InferenceProcess(embedded_model_dir, extra_args=["--grace", str(GRACE_S)]))
        orchestrator = RunningOrchestrator(redis.url, [r.address for r in replicas])
        yield orchestrator, replicas
    finally:
        if orchestrator is not None:
            orchestrator.stop()
        for replica in replicas:
            replica.stop()
        redis.stop()


def test_a_replica_stopped_mid_answer_finishes_it_takes_no_new_ask_and_exits(two_replica_processes):
    orchestrator, (stopping, other) = two_replica_processes
    router = orchestrator.service.router
    router.note_served(stopping.address, preamble_key())     # prefix locality: the router's choice
    tokens, done, first_token = [], [], threading.Event()

    def long_answer() -> None:
        for response in orchestrator.stub.Ask(ask_request(LONG), timeout=300):
            kind = response.event.WhichOneof("kind")
            if kind == "token":
                tokens.append(response.event.token)
                first_token.set()
            elif kind == "done":
                done.append(response.event.done)

    streaming = threading.Thread(target=long_answer)
    streaming.start()
    assert first_token.wait(120), "the long answer did not start"
    stopping.signal(signal.SIGTERM)
    wait_for(lambda: router.replica(stopping.address).unavailable == "health NOT_SERVING",
             "the orchestrator sees the stopping replica's NOT_SERVING")

    short = [r.event.done for r in orchestrator.stub.Ask(ask_request(4), timeout=120)
             if r.event.WhichOneof("kind") == "done"]
    assert short[0].replica == other.address                 # no new ask for the stopping replica

    streaming.join(300)
    assert done and done[0].replica == stopping.address      # finished where it started, not resumed
    assert len(tokens) == LONG
    assert stopping.process.wait(timeout=GRACE_S / 4) == 0   # exits once drained, well inside its grace
