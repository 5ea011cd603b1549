"""The tenant gate's queue deadline (admission.py): a request with no token by its tenant's `max_queue_s` is
shed UNAVAILABLE, unless the replica has begun its prefill (SCHEDULED), which gets the prefill grace for its
first token, and no more. Order and outcomes only: the waits are far from each bound."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import CollectorRegistry

from orchestrator.admission import TenantGate
from orchestrator.metrics import OrchestratorMetrics
from protos import common_pb2, inference_pb2
from servicekit.tenants import parse_tenants

TENANTS = parse_tenants('[tenants.t]\nkeys = ["k"]\nmax_queue_s = 0.3\n')


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code


class Context:
    def invocation_metadata(self):
        return (("authorization", "Bearer k"),)

    async def abort(self, code, details="", trailing_metadata=()):
        raise Aborted(code)


def scheduled() -> inference_pb2.InferenceEvent:
    return inference_pb2.InferenceEvent(lifecycle=common_pb2.LifecycleEvent(
        kind=common_pb2.LIFECYCLE_EVENT_KIND_SCHEDULED))


def token() -> inference_pb2.InferenceEvent:
    return inference_pb2.InferenceEvent(token=common_pb2.GeneratedToken(id=1))


async def replica(*events_and_waits):
    for item in events_and_waits:
        if isinstance(item, float):
            await asyncio.sleep(item)
        else:
            yield item


async def served(responses, grace_s: float) -> list:
    gate = TenantGate(TENANTS, None, OrchestratorMetrics(CollectorRegistry()), prefill_grace_s=grace_s)
    return [event async for event in gate.serve(Context(), "r1", responses, lambda event: event)]


async def test_a_request_still_queued_at_max_queue_s_is_shed():
    with pytest.raises(Aborted) as shed:
        await served(replica(3.0, token()), grace_s=10.0)
    assert shed.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_request_whose_prefill_began_gets_the_grace_for_its_first_token():
    events = await served(replica(scheduled(), 1.0, token()), grace_s=10.0)   # past max_queue_s, within the grace
    assert [e.WhichOneof("kind") for e in events] == ["lifecycle", "token"]


async def test_the_grace_is_bounded_a_prefill_that_never_ends_is_shed():
    with pytest.raises(Aborted) as shed:
        await served(replica(scheduled(), 30.0, token()), grace_s=0.5)
    assert shed.value.code == grpc.StatusCode.UNAVAILABLE
