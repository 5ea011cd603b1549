"""Fair share between tenants in the vLLM scheduler class's ranker (vllm_backend/ranking.py), with plain
objects standing in for vLLM's requests (no vLLM needed): the same merged order as the native engine,
charged with the tokens vLLM scheduled."""

from __future__ import annotations

from types import SimpleNamespace

from inference_svc.engine.policies import make_policy
from inference_svc.vllm_backend.ranking import PolicyRanker, read_share, share_marks, stream_marks
from tests.service.test_vllm_ranking import Status


def vreq(rid: str, arrival: float, tenant: str, weight: float = 1.0, priority: int = 0, tokens: int = 40):
    marks = {**stream_marks(True, arrival), **share_marks(tenant, weight, priority)}
    return SimpleNamespace(request_id=rid, arrival_time=arrival, status=Status.WAITING, num_computed_tokens=0,
                           num_tokens=tokens, num_preemptions=0, streaming_queue=[],
                           sampling_params=SimpleNamespace(extra_args=marks))


def test_share_marks_read_back():
    assert read_share(SimpleNamespace(extra_args=share_marks("team", 2.5, -1))) == ("team", 2.5, -1)
    assert read_share(SimpleNamespace(extra_args=stream_marks(True, 0.0))) is None


def test_the_ranker_merges_tenants_by_counter_with_the_policy_within_each():
    ranker = PolicyRanker(make_policy("fcfs", fair_share=True), clock=lambda: 100.0)
    flood = [vreq(f"b{i}", float(i), "flood") for i in range(6)]
    light = [vreq(f"a{i}", 50.0 + i, "light") for i in range(2)]
    order = [r.request_id for r in ranker.rank(flood + light)]
    assert order[:4] == ["b0", "a0", "b1", "a1"] and order[4:] == ["b2", "b3", "b4", "b5"]


def test_scheduled_tokens_are_charged_to_the_requests_tenant_by_weight():
    ranker = PolicyRanker(make_policy("fcfs", fair_share=True), clock=lambda: 100.0)
    requests = [vreq("h", 0.0, "heavy", weight=4.0), vreq("l", 1.0, "light")]
    ranker.rank(requests)
    ranker.charge({"h": 40, "l": 10, "unknown": 99})
    counters = ranker.policy.counters
    assert (counters.counter("heavy"), counters.counter("light")) == (10.0, 10.0)
    ranker.charge({"h": 40})                  # heavy is now ahead: light's next request goes first
    more = [vreq("h2", 2.0, "heavy", weight=4.0), vreq("l2", 3.0, "light")]
    assert ranker.rank(requests + more)[0].request_id == "l"
