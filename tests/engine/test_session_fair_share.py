"""Fair share over session work (native/sessions.py, engine/fair_share.py) on the fake runner: a session's
ingestion and Flash evaluations are charged to the tenant that created it, a query to the tenant that asks
it, each at its weight; a light tenant's session queries are admitted ahead of a flood's backlog; and an
idle session banks its tenant no credit. Counts and order, never time."""

from __future__ import annotations

import pytest

from inference_svc.engine.fair_share import Share
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.native.sessions import SessionFormat, SessionManager
from tests.engine.engine_helpers import capture_plans, fake_engine

FMT = SessionFormat(head_prefix="<sys>", query_suffix="<a>")
GREEDY = SamplingParams(max_tokens=5, speculation="off")


def make(fair: bool = True, **config):
    engine = fake_engine(device_blocks=256, cpu_blocks=64, policy="fcfs", policy_options={"fair_share": fair},
                         **{"budget": 64, **config})
    return engine, SessionManager(engine, FMT, query_room_tokens=16)


def steps(engine, manager, n=400) -> None:
    """Step until nothing is runnable (a session's state never finishes)."""
    for _ in range(n):
        if not engine.has_work():
            return
        manager.observe(None, engine.step())


def charges(engine) -> list[tuple[str, str, float, int]]:
    """Every charge the scheduler makes from now on: (request id, tenant, weight, tokens)."""
    policy, seen = engine.scheduler.policy, []
    charge = policy.charge

    def noting(request, tokens):
        seen.append((request.request_id, request.tenant, request.tenant_weight, tokens))
        charge(request, tokens)

    policy.charge = noting
    return seen


def generate(engine, rid: str, share: Share, text: str) -> None:
    """A request of `share` (each text its own first letter: no prefix shared with another)."""
    engine.open(rid, [Segment(text=text)], SamplingParams(max_tokens=3), share=share)
    engine.finish(rid)


def test_ingestion_and_flash_are_the_owners_and_a_query_is_its_askers():
    engine, manager = make()
    seen = charges(engine)
    owner, asker = Share("owner", 2.0), Share("asker", 1.0)
    manager.create("s", "Be brief.", share=owner)
    manager.ingest("s", [Segment(text="alpha beta gamma"), Segment(text="delta epsilon")])
    steps(engine, manager)
    info = manager.describe("s")
    state = [c for c in seen if c[0].startswith("session:s:state")]
    assert {(tenant, weight) for _, tenant, weight, _ in state} == {("owner", 2.0)}
    assert sum(tokens for *_, tokens in state) == info.head_tokens + info.data_tokens
    assert engine.policy.counters.counter("owner") == (info.head_tokens + info.data_tokens) / 2.0

    seen.clear()
    manager.query("s", "what?", GREEDY, "q1", share=asker, priority=-3)
    assert engine.requests["q1"].priority == -3
    steps(engine, manager)
    question_tokens = len(engine.tokenizer.encode(FMT.query("what?")))
    assert {(rid, tenant) for rid, tenant, _, _ in seen} == {("q1", "asker")}
    assert sum(tokens for *_, tokens in seen) == question_tokens + 4    # the question, then 4 decode steps

    seen.clear()
    manager.register("s", "anything new?", max_tokens=3)
    steps(engine, manager)
    assert seen and {(tenant, weight) for rid, tenant, weight, _ in seen} == {("owner", 2.0)}
    assert all(":flash:" in rid for rid, *_ in seen)

    seen.clear()                                # retention: the state prefilled again, still the owner's
    manager.close("s")
    manager.create("r", "Be brief.", retention_tokens=30, share=owner)
    manager.ingest("r", [Segment(text="x" * 20)])
    manager.ingest("r", [Segment(text="y" * 20)])     # drops the first: a new state request
    steps(engine, manager)
    assert {rid for rid, *_ in seen} >= {"session:r:state:0", "session:r:state:1"}
    assert {tenant for _, tenant, _, _ in seen} == {"owner"}


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "fcfs"])
def test_a_flood_does_not_hold_a_light_tenants_session_queries_behind_its_backlog(fair):
    engine, manager = make(fair, max_running=3, budget=32)
    manager.create("s", "Be brief.", share=Share("light"))
    manager.ingest("s", [Segment(text="the log says web-1 started")])
    steps(engine, manager)
    for i in range(10):
        generate(engine, f"b{i}", Share("flood"), f"{chr(65 + i)}: a flood request ")
    for _ in range(3):                                # the flood holds the replica (past the session's cost) ...
        manager.observe(None, engine.step())
    plans = capture_plans(engine)
    for i in range(3):                                # ... when the session's tenant asks
        manager.query("s", f"question {i}?", GREEDY, f"a{i}", share=Share("light"))
    steps(engine, manager)
    order = list(dict.fromkeys(r.request_id for plan in plans for r in plan.newly_scheduled))
    assert set(order) >= {"a0", "a1", "a2"}
    lights = [order.index(f"a{i}") for i in range(3)]
    flood_before_last_light = [r for r in order[:max(lights)] if r.startswith("b")]
    if fair:
        # each query is admitted after at most one more flood request: none waits for the backlog
        assert len(flood_before_last_light) <= 3 and lights == sorted(lights)
    else:
        assert len(flood_before_last_light) == len([r for r in order if r.startswith("b")])   # FCFS: all first


def test_an_idle_session_banks_its_tenant_no_credit():
    engine, manager = make(max_running=3, budget=32)
    counters = engine.policy.counters
    manager.create("s", "Be brief.", share=Share("light"))
    manager.ingest("s", [Segment(text="the log says web-1 started")])
    steps(engine, manager)
    for i in range(16):                               # the flood is served while the session idles
        generate(engine, f"early-{i}", Share("flood"), f"{chr(65 + i)}: a flood request ")
    steps(engine, manager)
    assert counters.counter("flood") > 4 * counters.counter("light")
    for i in range(6):
        generate(engine, f"b{i}", Share("flood"), f"{chr(97 + i)}: a flood request ")
    plans = capture_plans(engine)
    for i in range(4):
        manager.query("s", f"question {i}?", GREEDY, f"a{i}", share=Share("light"))
    manager.observe(None, engine.step())
    assert counters.counter("light") >= counters.counter("flood") - 64   # lifted, within one step's charge
    steps(engine, manager)
    order = list(dict.fromkeys(r.request_id for plan in plans for r in plan.newly_scheduled))
    last_light = max(order.index(f"a{i}") for i in range(4))
    # level counters: the tenants alternate; the idle time bought the light tenant no run of its own
    assert sum(r.startswith("b") for r in order[:last_light]) >= 2
