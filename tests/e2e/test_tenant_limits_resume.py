"""A tenant's limits outlive the orchestrator that admitted its request (orchestrator/limits.py).

Real parts: Redis, a replay retriever, one fp32 replica behind a gate (tests/support/inference_gate.py)
that holds an answer at an exact token, and two orchestrators, each its own process, sharing a tenants
file in which one tenant may run one request at a time. An Ask of that tenant is held on the first
orchestrator, which is then SIGKILLed; the Ask is resumed on the second (as `servicekit.ask_resume` does).
The request's record keeps its tenant, the resumed Ask keeps the one slot (counted once, not twice), so
the tenant's other Asks are refused RESOURCE_EXHAUSTED until it ends, and admitted after.
"""

from __future__ import annotations

import threading
import uuid

import grpc
import pytest
import redis

from orchestrator.limits import PREFIX
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from retriever_svc.replay.trace import Trace, TraceChunk, TraceDocument, TraceQuery
from servicekit.auth import bearer_metadata
from tests.support.gated_world import gated_world
from tests.support.inference_gate import InferenceGate
from tests.support.orchestrator import OrchestratorProcess

HANG_S = 300          # a guard against a hang, not a timing bound
KILL_AFTER = 3
MAX_TOKENS = 24
STACK_KEY = "sk-resume-stack-own"
KEY = "solo-key"
OTHER_KEY = "other-key"
TENANT = f"solo-{uuid.uuid4().hex[:8]}"
TENANTS = f"""
[tenants.{TENANT}]
keys = ["{KEY}"]
max_concurrent = 1

[tenants.other]
keys = ["{OTHER_KEY}"]
"""
QUESTION = "How do I read a text file in Python?"
TRACE = Trace((TraceQuery("files", QUESTION, "anns", "synthesized", (
    TraceChunk(0.0, "append", True, (TraceDocument("d1", "Reading files", "http://x/files.html",
                                                   "Use open(path) to open a file and read() to read it."),)),
)),))


@pytest.fixture
def world(embedded_model_dir, tmp_path):
    with gated_world(embedded_model_dir, tmp_path, trace=TRACE) as w:
        (tmp_path / "tenants.toml").write_text(TENANTS)
        orchestrators = [w.parts.add(OrchestratorProcess(
            w.redis.url, [w.gate.address], anns=w.retriever.address, log_path=tmp_path / f"orchestrator-{i}.log",
            args=("--tenants", str(tmp_path / "tenants.toml"), "--tenant-lease", "600"),   # outlives the test
            env={"STREAMRAG_API_KEY": STACK_KEY})) for i in range(2)]
        yield w.redis, w.gate, orchestrators


def ask_request(request_id: str, resume: orchestrator_pb2.AskResume | None = None) -> orchestrator_pb2.AskRequest:
    request = orchestrator_pb2.AskRequest(question=QUESTION, max_tokens=MAX_TOKENS, request_id=request_id)
    if resume is not None:
        request.resume.CopyFrom(resume)
    return request


def in_thread(address: str, request: orchestrator_pb2.AskRequest, got: dict) -> threading.Thread:
    """The Ask on the orchestrator at `address`, its responses (and its error, if any) into `got`."""
    def run():
        got["responses"] = []
        try:
            with grpc.insecure_channel(address) as channel:
                for response in orchestrator_pb2_grpc.OrchestratorStub(channel).Ask(
                        request, timeout=HANG_S, metadata=bearer_metadata(KEY)):
                    got["responses"].append(response)
        except grpc.RpcError as exc:
            got["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def refused(orchestrator: OrchestratorProcess, request_id: str) -> grpc.RpcError:
    with grpc.insecure_channel(orchestrator.address) as channel, pytest.raises(grpc.RpcError) as raised:
        list(orchestrator_pb2_grpc.OrchestratorStub(channel).Ask(ask_request(request_id), timeout=HANG_S,
                                                                 metadata=bearer_metadata(KEY)))
    return raised.value


def held(gate: InferenceGate, thread: threading.Thread, got: dict) -> None:
    """Wait until the gate holds an answer (the Ask is in flight at the replica)."""
    while not gate.held.wait(0.05):
        assert thread.is_alive(), got.get("error")


def tokens_of(responses) -> list:
    return [r.event.token for r in responses if r.event.WhichOneof("kind") == "token"]


def in_flight(store: redis.Redis) -> list[str]:
    return store.zrange(f"{PREFIX}{TENANT}:concurrent", 0, -1)


def test_a_resumed_ask_keeps_its_tenant_and_its_one_slot_after_its_orchestrator_is_killed(world):
    store_server, gate, (first, second) = world
    store = redis.Redis.from_url(store_server.url, decode_responses=True)
    got: dict = {}
    gate.arm(KILL_AFTER)
    thread = in_thread(first.address, ask_request("held"), got)
    held(gate, thread, got)
    over = refused(second, "second-while-held")            # the slot is held across orchestrators
    assert over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_concurrent" in over.details()
    while len(tokens_of(list(got["responses"]))) < KILL_AFTER:   # the caller has what the gate let through
        assert thread.is_alive(), got.get("error")
        thread.join(0.05)
    first.kill()                                            # SIGKILL: nothing of it frees the slot
    gate.release()
    thread.join(HANG_S)
    assert isinstance(got.get("error"), grpc.RpcError), "the Ask broke with its orchestrator"
    tokens = tokens_of(got["responses"])
    assert [t.index for t in tokens] == list(range(KILL_AFTER))

    # nothing lost: the record keeps its tenant, and the dead orchestrator's slot is still held
    admin = orchestrator_pb2_grpc.OrchestratorStub(grpc.insecure_channel(second.address))
    record = admin.GetRequest(orchestrator_pb2.GetRequestRequest(request_id="held"), timeout=60,
                              metadata=bearer_metadata(STACK_KEY)).record
    assert record.tenant == TENANT
    listed = admin.ListRequests(orchestrator_pb2.ListRequestsRequest(limit=50, tenant=TENANT), timeout=60,
                                metadata=bearer_metadata(STACK_KEY)).records
    assert "held" in {r.request_id for r in listed} and {r.tenant for r in listed} == {TENANT}
    assert in_flight(store) == ["held"]
    assert refused(second, "second-after-kill").code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    # another tenant's key may not resume it (it would continue this tenant's stored prompt)
    resume = orchestrator_pb2.AskResume(token_ids=[t.id for t in tokens], text="".join(t.text for t in tokens),
                                        attempt=1)
    with grpc.insecure_channel(second.address) as channel, pytest.raises(grpc.RpcError) as raised:
        list(orchestrator_pb2_grpc.OrchestratorStub(channel).Ask(ask_request("held", resume), timeout=HANG_S,
                                                                 metadata=bearer_metadata(OTHER_KEY)))
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED, raised.value.details()
    assert in_flight(store) == ["held"]

    # resumed on the second orchestrator, held again before its first new token: it keeps the one slot
    resumed: dict = {}
    gate.arm(0)
    thread = in_thread(second.address, ask_request("held", resume), resumed)
    held(gate, thread, resumed)
    assert in_flight(store) == ["held"]                     # the same slot, counted once
    over = refused(second, "second-while-resumed")
    assert over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_concurrent" in over.details()
    gate.release()
    thread.join(HANG_S)
    assert "error" not in resumed, resumed.get("error")
    done = resumed["responses"][-1].event
    assert done.WhichOneof("kind") == "done" and done.done.request_id == "held"
    rest = tokens_of(resumed["responses"])
    assert rest and [t.index for t in rest] == list(range(KILL_AFTER, KILL_AFTER + len(rest)))   # went on
    assert done.done.answer == "".join(t.text for t in tokens + rest)
    assert in_flight(store) == []                           # its end freed the slot

    # a new Ask of the tenant is admitted and answered
    after: dict = {}
    in_thread(second.address, ask_request("after"), after).join(HANG_S)
    assert "error" not in after, after.get("error")
    assert after["responses"][-1].event.WhichOneof("kind") == "done"
    record = admin.GetRequest(orchestrator_pb2.GetRequestRequest(request_id="held"), timeout=60,
                              metadata=bearer_metadata(STACK_KEY)).record
    assert record.tenant == TENANT
