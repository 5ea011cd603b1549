"""A running request's slot is renewed, a dead orchestrator's slot frees within a lease, and two resumes
of one Ask at once: one runs, the other is told ABORTED (orchestrator/admission.py, limits.py,
resume_claims.py).

Real parts: Redis, a replay retriever, one fp32 replica behind a gate (tests/support/inference_gate.py)
that holds an answer at an exact token, and orchestrators, each its own process, with a short
`--tenant-lease` and a tenants file in which one tenant may run one request at a time. No timing is
asserted: the tests wait for what Redis shows (a lease renewed past its first end, a slot freed), with
a generous deadline against a hang.
"""

from __future__ import annotations

import time

import grpc
import pytest
import redis

from orchestrator.limits import PREFIX
from orchestrator.resume_claims import PREFIX as CLAIM_PREFIX
from protos import orchestrator_pb2
from tests.e2e.test_tenant_limits_resume import (
    HANG_S,
    KEY,
    KILL_AFTER,
    TRACE,
    ask_request,
    held,
    in_thread,
    tokens_of,
)
from tests.support.gated_world import gated_world
from tests.support.inference_gate import InferenceGate
from tests.support.orchestrator import OrchestratorProcess

LEASE_S = 6.0           # short for the test (the default is 30 s): renewed every 2 s
TENANT = "solo"
TENANTS = f"""
[tenants.{TENANT}]
keys = ["{KEY}"]
max_concurrent = 1
"""
STACK_KEY = "sk-leases-stack-own"


@pytest.fixture(scope="module")
def backends(embedded_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("leases")
    with gated_world(embedded_model_dir, tmp, trace=TRACE) as w:
        (tmp / "tenants.toml").write_text(TENANTS)
        yield w.redis, w.retriever, w.gate, tmp / "tenants.toml"


@pytest.fixture
def world(backends, tmp_path):
    """(redis client, gate, three orchestrator processes); the tenant's counters start empty."""
    store_server, retriever, gate, tenants = backends
    store = redis.Redis.from_url(store_server.url, decode_responses=True)
    for key in store.scan_iter(f"{PREFIX}*"):
        store.delete(key)
    orchestrators: list[OrchestratorProcess] = []
    try:
        for i in range(3):
            orchestrators.append(OrchestratorProcess(
                store_server.url, [gate.address], anns=retriever.address, log_path=tmp_path / f"orchestrator-{i}.log",
                args=("--tenants", str(tenants), "--tenant-lease", str(LEASE_S)), env={"STREAMRAG_API_KEY": STACK_KEY}))
        yield store, gate, orchestrators
    finally:
        for orchestrator in orchestrators:
            orchestrator.stop()
        store.close()


def slots(store: redis.Redis) -> dict[str, float]:
    return dict(store.zrange(f"{PREFIX}{TENANT}:concurrent", 0, -1, withscores=True))


def ask(address: str, request_id: str) -> grpc.RpcError | list:
    """The Ask's responses, or its error."""
    got: dict = {}
    in_thread(address, ask_request(request_id), got).join(HANG_S)
    return got.get("error") or got["responses"]


def kill_while_answering(gate: InferenceGate, orchestrator: OrchestratorProcess, request_id: str) -> list:
    """Ask on `orchestrator`, SIGKILL it once the caller has `KILL_AFTER` tokens; the tokens the caller got."""
    got: dict = {}
    gate.arm(KILL_AFTER)
    thread = in_thread(orchestrator.address, ask_request(request_id), got)
    held(gate, thread, got)
    while len(tokens_of(list(got["responses"]))) < KILL_AFTER:
        assert thread.is_alive(), got.get("error")
        thread.join(0.05)
    orchestrator.kill()
    gate.release()
    thread.join(HANG_S)
    assert isinstance(got.get("error"), grpc.RpcError), "the Ask broke with its orchestrator"
    return tokens_of(got["responses"])


def test_a_running_asks_slot_is_renewed_and_a_killed_orchestrators_slot_frees_within_its_lease(world):
    store, gate, (first, second, _) = world
    got: dict = {}
    gate.arm(KILL_AFTER)
    thread = in_thread(first.address, ask_request("held"), got)
    held(gate, thread, got)
    first_end = slots(store)["held"]
    deadline = time.monotonic() + HANG_S
    while slots(store)["held"] <= first_end + LEASE_S:     # renewed after its first lease would have ended
        assert time.monotonic() < deadline, "the running Ask's lease was not renewed"
        time.sleep(0.2)
    over = ask(second.address, "while-held")               # so the slot is still the running Ask's
    assert isinstance(over, grpc.RpcError) and over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, over

    first.kill()                                            # SIGKILL: nothing of it frees the slot, nor renews it
    gate.release()
    thread.join(HANG_S)
    deadline = time.monotonic() + HANG_S
    while True:                                             # admitted once the dead one's lease ended
        answered = ask(second.address, f"after-{time.monotonic_ns()}")
        if not isinstance(answered, grpc.RpcError):
            break
        assert answered.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, answered
        assert "max_concurrent" in answered.details() and time.monotonic() < deadline, answered.details()
        time.sleep(0.5)
    assert answered[-1].event.WhichOneof("kind") == "done"
    assert "held" not in slots(store) and slots(store) == {}   # the new Ask's ended too


def test_two_resumes_of_one_ask_at_once_one_runs_and_the_other_is_aborted(world):
    store, gate, (first, second, third) = world
    tokens = kill_while_answering(gate, first, "twice")
    resume = orchestrator_pb2.AskResume(token_ids=[t.id for t in tokens], text="".join(t.text for t in tokens),
                                        attempt=1)
    gate.arm(0)                                             # the resume that runs is held before its first new token
    results = [{}, {}]
    threads = [in_thread(orchestrator.address, ask_request("twice", resume), got)
               for orchestrator, got in zip((second, third), results, strict=True)]
    deadline = time.monotonic() + HANG_S
    while not (gate.held.is_set() and any("error" in got for got in results)):
        assert time.monotonic() < deadline and all(thread.is_alive() or "error" in got
                                                   for thread, got in zip(threads, results, strict=True)), results
        time.sleep(0.05)
    refused = next(got["error"] for got in results if "error" in got)
    assert refused.code() == grpc.StatusCode.ABORTED and "already being resumed" in refused.details()
    assert store.exists(f"{CLAIM_PREFIX}twice")
    gate.release()
    for thread in threads:
        thread.join(HANG_S)
    ran = [got for got in results if "error" not in got]
    assert len(ran) == 1, results                           # exactly one continued
    done = ran[0]["responses"][-1].event
    assert done.WhichOneof("kind") == "done" and done.done.request_id == "twice"
    rest = tokens_of(ran[0]["responses"])
    assert rest and [t.index for t in rest] == list(range(KILL_AFTER, KILL_AFTER + len(rest)))
    assert done.done.answer == "".join(t.text for t in tokens + rest)
    assert not store.exists(f"{CLAIM_PREFIX}twice")         # its end released the claim
    assert slots(store) == {}
