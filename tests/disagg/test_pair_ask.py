"""An Ask through the orchestrator on a prefill replica and a decode replica: the router pairs them,
the answer equals one colocated replica's, and the hand-off is in the lifecycle stored in Redis."""

from __future__ import annotations

import time

import pytest

from protos import orchestrator_pb2
from tests.support.stack import replicas_behind_an_orchestrator

NONE = orchestrator_pb2.RETRIEVER_CHOICE_NONE


@pytest.fixture
def pair_stack(embedded_model_dir, tmp_path):
    # the decode replica first: pairing must skip it
    with replicas_behind_an_orchestrator(embedded_model_dir, tmp_path, ("decode", "prefill"),
                                         router_refresh_s=0.2) as running:
        yield running.stub, running.orchestrator.service, running.replicas


def ask(stub, request_id, no_stream=False):
    done = None
    for response in stub.Ask(orchestrator_pb2.AskRequest(question="What is the capital of France?", retriever=NONE,
                                                         max_tokens=16, request_id=request_id, no_stream=no_stream),
                             timeout=120):
        if response.event.WhichOneof("kind") == "done":
            done = response.event.done
    return done


def test_a_paired_ask_hands_off_and_records_it(pair_stack):
    stub, service, (decode, prefill) = pair_stack
    deadline = time.monotonic() + 60
    while not all(r.stats is not None and r.stats.role for r in service.router.replicas):
        assert time.monotonic() < deadline, "the router never saw the roles"
        time.sleep(0.1)
    baseline = ask(stub, "colocated", no_stream=True)       # Generate: always colocated
    calls = decode.service.kv_transfer.calls
    done = ask(stub, "paired")
    assert done.replica == prefill.address                   # the prefill side answers the call ...
    assert decode.service.kv_transfer.calls == calls + 1     # ... decoded on the decode side
    assert done.answer == baseline.answer
    record = stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id="paired"), timeout=30).record
    kinds = [event.kind for event in record.events]
    assert "KV_TRANSFER_START" in kinds and "KV_HANDOFF" in kinds and "KV_TRANSFER_FALLBACK" not in kinds
    assert kinds.index("KV_HANDOFF") < kinds.index("FIRST_TOKEN")
    handoff = next(e for e in record.events if e.kind == "KV_HANDOFF")
    assert int(handoff.fields["count"]) > 0 and "after the last input" in handoff.fields["detail"]
    prefill.wait_until_all_blocks_free()
    decode.wait_until_all_blocks_free()
