"""Fair share between tenants (engine/fair_share.py): the virtual token counters' bookkeeping, streaming
charges included, the merged order, and a flood that does not hold a light tenant back (order and counts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inference_svc.engine.fair_share import FairSharePolicy, Share, VirtualTokenCounters
from inference_svc.engine.policies import FCFSPolicy, PolicyContext, make_policy
from inference_svc.engine.request import RequestState, Segment
from inference_svc.engine.sampler import SamplingParams
from tests.engine.engine_helpers import capture_plans, fake_engine, run_to_completion

CTX = PolicyContext(now=100.0)


def req(rid: str, tenant: str, arrival: float, pending: int = 10, weight: float = 1.0, priority: int = 0):
    return SimpleNamespace(request_id=rid, tenant=tenant, tenant_weight=weight, priority=priority,
                           arrival_time=arrival, last_chunk_arrival_time=arrival, context_complete=True,
                           num_schedulable_tokens=pending)


# ---------------------------------------------------------------- the counters
def test_tokens_are_charged_divided_by_the_tenants_weight():
    counters = VirtualTokenCounters()
    counters.charge("a", 30, 3.0)
    counters.charge("b", 30, 1.0)
    counters.charge("b", 0, 1.0)
    assert (counters.counter("a"), counters.counter("b"), counters.counter("never")) == (10.0, 30.0, 0.0)


def test_a_tenant_back_from_idle_is_lifted_to_the_smallest_backlogged_counter():
    counters = VirtualTokenCounters()
    counters.note_backlogged({"a", "b"})
    counters.charge("a", 100, 1.0)
    counters.charge("b", 40, 1.0)
    counters.note_backlogged({"a", "b"})
    counters.note_backlogged({"a", "b", "c", "d"})       # c new, d new: lifted to min(a, b) = 40
    assert counters.counter("c") == counters.counter("d") == 40.0
    counters.note_backlogged({"a"})                      # b idles ...
    counters.charge("a", 500, 1.0)
    counters.note_backlogged({"a", "b"})                 # ... and banks no credit for it: 600, not 40
    assert counters.counter("b") == 600.0
    counters.charge("b", 1000, 1.0)
    counters.note_backlogged({"b"})
    counters.note_backlogged({"a", "b"})                 # a returns to b's 1600, never down
    assert counters.counter("a") == 1600.0


def test_a_tenant_new_to_an_idle_replica_starts_at_the_level_the_last_ones_reached():
    counters = VirtualTokenCounters()
    counters.note_backlogged({"light"})
    counters.charge("light", 900, 1.0)                   # served alone, then idle
    counters.note_backlogged(set())
    counters.note_backlogged({"flood"})                  # a new tenant, alone: not at 0, 900 tokens behind light
    assert counters.counter("flood") == 900.0
    counters.charge("flood", 50, 1.0)
    counters.note_backlogged({"flood", "light"})         # light returns level with the flood's smallest
    assert counters.counter("light") == 950.0


def test_tenants_returning_together_after_everyone_idled_start_level():
    counters = VirtualTokenCounters()
    counters.note_backlogged({"a"})
    counters.charge("a", 70, 1.0)
    counters.note_backlogged(set())
    counters.note_backlogged({"a", "b"})
    assert counters.counter("a") == counters.counter("b") == 70.0


# ---------------------------------------------------------------- the merged order
def test_one_tenant_keeps_the_policys_order():
    policy = FairSharePolicy(FCFSPolicy())
    requests = [req(f"r{i}", "t", arrival=float(10 - i)) for i in range(5)]
    assert [r.request_id for r in policy.order(requests, CTX)] == ["r4", "r3", "r2", "r1", "r0"]


def test_a_light_tenant_is_merged_ahead_of_a_floods_backlog():
    policy = FairSharePolicy(FCFSPolicy())
    flood = [req(f"b{i}", "flood", arrival=float(i)) for i in range(8)]
    light = [req(f"a{i}", "light", arrival=50.0 + i) for i in range(2)]
    order = [r.request_id for r in policy.order(flood + light, CTX)]
    assert order[:4] == ["b0", "a0", "b1", "a1"]          # alternating at equal counters, the flood's head first
    assert order[4:] == [f"b{i}" for i in range(2, 8)]


def test_weights_give_a_tenant_its_share_of_the_order():
    policy = FairSharePolicy(FCFSPolicy())
    heavy = [req(f"h{i}", "heavy", arrival=float(i), weight=3.0) for i in range(12)]
    plain = [req(f"p{i}", "plain", arrival=float(i) + 0.5) for i in range(12)]
    first8 = [r.tenant for r in policy.order(heavy + plain, CTX)[:8]]
    assert first8.count("heavy") == 6 and first8.count("plain") == 2


def test_priority_orders_within_a_tenant_but_takes_no_share_from_another():
    policy = FairSharePolicy(FCFSPolicy())
    flood = [req(f"b{i}", "flood", arrival=float(i)) for i in range(4)]
    light = [req("a-normal", "light", arrival=10.0), req("a-urgent", "light", arrival=11.0, priority=-5)]
    urgent_flood = req("b-urgent", "flood", arrival=12.0, priority=-100)
    order = [r.request_id for r in policy.order([*flood, *light, urgent_flood], CTX)]
    assert order.index("a-urgent") < order.index("a-normal")
    assert order[0] == "b-urgent" and order[1] == "a-urgent"   # the flood's urgent one leads its own queue only
    assert [r for r in order if r.startswith("a")] == ["a-urgent", "a-normal"]
    assert order.index("a-normal") == 3


def test_the_counter_lead_decides_who_goes_first():
    policy = FairSharePolicy(FCFSPolicy())
    policy.counters.note_backlogged({"flood", "light"})
    policy.counters.charge("flood", 1000, 1.0)
    order = [r.request_id for r in policy.order([req("b0", "flood", 0.0), req("a0", "light", 5.0),
                                                 req("a1", "light", 6.0)], CTX)]
    assert order == ["a0", "a1", "b0"]


def test_make_policy_wraps_only_when_asked():
    assert isinstance(make_policy("fcfs"), FCFSPolicy)
    fair = make_policy("lcas", fair_share=True, starvation_s=2.0)
    assert isinstance(fair, FairSharePolicy) and fair.name == "lcas" and fair.inner.starvation_s == 2.0
    with pytest.raises(ValueError):
        Share("t", 0.0)


# ---------------------------------------------------------------- in the engine
GREEDY = SamplingParams(max_tokens=3)


def fair_engine(**config):
    return fake_engine(policy="fcfs", policy_options={"fair_share": True}, **config)


def open_for(engine, rid: str, share: Share, text: str, complete: bool = True):
    request = engine.open(rid, [Segment(text=text)], GREEDY)
    request.tenant, request.tenant_weight = share.tenant, share.weight
    if complete:
        engine.finish(rid)
    return request


def test_a_streamed_prompt_is_charged_as_its_chunks_are_prefilled_and_each_token_as_generated():
    engine = fair_engine(budget=64)
    counters = engine.policy.counters
    share = Share("streamer", 2.0)
    open_for(engine, "s", share, "head ", complete=False)       # 5 tokens
    engine.step()
    assert counters.counter("streamer") == 5 / 2.0              # only what is prefilled: the head
    engine.append("s", [Segment(text="a chunk of twenty...")])  # 20 tokens, charged once prefilled
    assert counters.counter("streamer") == 5 / 2.0
    engine.step()
    assert counters.counter("streamer") == 25 / 2.0
    engine.finish("s", [Segment(text="?")])
    run_to_completion(engine)
    # the suffix token, then one decode step per generated token after the first (sampled with the prefill)
    assert counters.counter("streamer") == (25 + 1 + 2) / 2.0


def _admission_order(engine) -> list[str]:
    plans = capture_plans(engine)
    run_to_completion(engine)
    return [request.request_id for plan in plans for request in plan.newly_scheduled]


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "fcfs"])
def test_a_flooding_tenant_does_not_hold_the_light_tenants_requests_behind_its_backlog(fair):
    engine = fake_engine(policy="fcfs", policy_options={"fair_share": fair}, max_running=2, budget=32)
    flood, light = Share("flood"), Share("light")
    for i in range(10):
        open_for(engine, f"b{i}", flood, f"flood request number {i} ")
    engine.step()                                   # the flood holds the replica ...
    for i in range(3):
        open_for(engine, f"a{i}", light, f"light request {i} ")   # ... when the light tenant asks
    order = _admission_order(engine)
    assert sorted(order) == sorted({*order}) and len(set(order)) == 13 - 2   # two were admitted before
    lights = [order.index(f"a{i}") for i in range(3)]
    flood_after = [r for r in order[:max(lights) + 1] if r.startswith("b")]
    if fair:
        # each light request is admitted after at most one more flood request: none waits for the backlog
        assert len(flood_after) <= 3 and lights == sorted(lights)
    else:
        assert len(flood_after) == 8                # plain FCFS: the whole backlog first


def test_decoding_requests_keep_their_place_and_the_counters_choose_among_the_rest():
    policy = FairSharePolicy(FCFSPolicy())
    policy.counters.note_backlogged({"flood", "light"})
    policy.counters.charge("flood", 1000, 1.0)             # the flood is far ahead ...
    decoding = [req(f"b-dec{i}", "flood", float(i)) for i in range(2)]
    for r in decoding:
        r.is_decoding = True                                # ... yet what it decodes is not displaced
    prefilling = req("b-pre", "flood", 2.5)                 # a complete prompt it is prefilling (holds KV) ...
    prefilling.is_decoding, prefilling.state = False, RequestState.RUNNING
    streamed = req("b-stream", "flood", 2.7)                # a prompt still streaming in: not begun
    streamed.is_decoding, streamed.state, streamed.context_complete = False, RequestState.RUNNING, False
    waiting = [req("b-early", "flood", 2.0), prefilling, streamed, req("b-wait", "flood", 3.0),
               req("a0", "light", 5.0)]
    order = [r.request_id for r in policy.order(decoding + waiting, CTX)]
    # ... keeps the policy's place among the flood's own, after the light tenant's
    assert order == ["b-dec0", "b-dec1", "a0", "b-early", "b-pre", "b-wait", "b-stream"]


def test_a_light_tenants_new_request_does_not_wait_for_a_flood_prefill_in_progress():
    """Prefills are chunked (budget 8): a light tenant's request that arrives while the flood's prefill is
    under way starts before that prefill ends (the counters choose each step); within the flood the policy
    (fcfs) keeps b1 behind b0."""
    engine = fair_engine(budget=8, max_running=3)
    open_for(engine, "b0", Share("flood"), "a flooding prompt of some thirty tokens or so, long enough " * 2)
    engine.step()                                            # b0's first chunk: its prefill has started
    open_for(engine, "b1", Share("flood"), "another flooding prompt, about as long as the first one " * 2)
    open_for(engine, "a0", Share("light"), "a light prompt of about twenty tokens, give or take a few ")
    plans = capture_plans(engine)
    run_to_completion(engine)
    prefilled = [chunk.request.request_id for plan in plans for chunk in plan.chunks
                 if chunk.start < chunk.request.num_prompt_tokens]
    assert prefilled.count("b0") >= 2 and prefilled.count("a0") >= 2        # several chunks each
    last = {rid: max(i for i, r in enumerate(prefilled) if r == rid) for rid in ("a0", "b0", "b1")}
    first = {rid: prefilled.index(rid) for rid in ("a0", "b0", "b1")}
    assert first["a0"] < last["b0"]                          # the light request did not wait for b0's end
    assert first["b1"] > last["b0"]                          # fcfs within the tenant: b1 after b0
