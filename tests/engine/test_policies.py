"""Scheduling policies: each policy's ranking and eviction order, exactly as defined.

Requests are built by hand; only the fields a policy reads are set. Pure CPU, no model.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_svc.engine.policies import (
    POLICIES,
    DefaultPolicy,
    FCFSPolicy,
    KLPMPolicy,
    LCASPolicy,
    MCPSPolicy,
    PolicyContext,
    make_policy,
)
from inference_svc.engine.request import Request, RequestState
from inference_svc.engine.sampler import SamplingParams

NOW = 100.0
CTX = PolicyContext(NOW)


def req(rid: str, arrival: float, **fields) -> Request:
    """A request arriving at `arrival` with the given fields overridden."""
    r = Request(rid, SamplingParams(), arrival_time=arrival)
    for name, value in fields.items():
        setattr(r, name, value)
    return r


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def shuffled(requests, seed: int = 0) -> list[Request]:
    out = list(requests)
    random.Random(seed).shuffle(out)
    return out


# --- default ------------------------------------------------------------------------------


def _default_mix() -> list[Request]:
    return [
        req("run_b", 5.0, state=RequestState.RUNNING, admitted_seq=7),
        req("fresh_late", 40.0),
        req("run_a", 9.0, state=RequestState.RUNNING, admitted_seq=2),
        req("pre_old", 1.0, state=RequestState.WAITING, preempted_at=20.0),
        req("fresh_early", 30.0),
        req("pre_new", 2.0, state=RequestState.SWAPPED, preempted_at=25.0),
        req("run_c", 1.0, state=RequestState.RUNNING, admitted_seq=11),
    ]


def test_default_orders_running_by_admission_then_preempted_newest_first_then_fresh_by_arrival():
    """RUNNING by admitted_seq, then preempted (latest preemption first), then fresh by arrival."""
    ranked = DefaultPolicy().order(shuffled(_default_mix()), CTX)
    assert ids(ranked) == ["run_a", "run_b", "run_c", "pre_new", "pre_old", "fresh_early", "fresh_late"]


def test_default_running_order_ignores_arrival_time():
    """A running request that arrived later but was admitted earlier stays ahead."""
    early_arrival = req("early", 1.0, state=RequestState.RUNNING, admitted_seq=5)
    late_arrival = req("late", 50.0, state=RequestState.RUNNING, admitted_seq=3)
    assert ids(DefaultPolicy().order([early_arrival, late_arrival], CTX)) == ["late", "early"]


def test_default_preempted_requests_bypass_earlier_fresh_arrivals():
    """A preempted request is re-queued ahead of fresh ones, even ones that arrived before it."""
    fresh = req("fresh", 1.0)
    preempted = req("preempted", 50.0, preempted_at=60.0)
    assert ids(DefaultPolicy().order([fresh, preempted], CTX)) == ["preempted", "fresh"]


def test_default_preemption_ties_broken_by_arrival():
    """Two requests preempted at the same instant: the earlier arrival first."""
    a = req("a", 3.0, preempted_at=10.0)
    b = req("b", 2.0, preempted_at=10.0)
    assert ids(DefaultPolicy().order([a, b], CTX)) == ["b", "a"]


def test_default_eviction_is_lifo_over_running_requests():
    """Eviction is the reverse ranking: the last admitted running request goes first."""
    policy = DefaultPolicy()
    ranked = policy.order(shuffled(_default_mix()), CTX)
    evict = policy.eviction_order(ranked)
    assert ids(evict) == list(reversed(ids(ranked)))
    running = [r for r in evict if r.state is RequestState.RUNNING]
    assert ids(running) == ["run_c", "run_b", "run_a"]


# --- fcfs ---------------------------------------------------------------------------------


def _tiered_mix() -> list[Request]:
    return [
        req("p1", 1.0, context_complete=False, last_chunk_arrival_time=90.0),
        req("c3", 3.0, context_complete=True, last_chunk_arrival_time=50.0),
        req("p2", 2.0, context_complete=False, last_chunk_arrival_time=95.0),
        req("c4", 4.0, context_complete=True, last_chunk_arrival_time=80.0),
        req("c5", 5.0, context_complete=True, last_chunk_arrival_time=60.0),
        req("p6", 6.0, context_complete=False, last_chunk_arrival_time=70.0),
    ]


def test_fcfs_complete_tier_by_completion_then_partial_by_arrival():
    """Complete-context requests first, in the order their context completed (c3 at 50, c5 at 60,
    c4 at 80: the order a non-streaming server would receive them in); then partial, by arrival."""
    ranked = FCFSPolicy().order(shuffled(_tiered_mix()), CTX)
    assert ids(ranked) == ["c3", "c5", "c4", "p1", "p2", "p6"]


def test_fcfs_without_streaming_is_arrival_order():
    """Prompts complete at arrival (non-streaming) are served first come, first served."""
    prompts = [req(f"r{i}", float(i), context_complete=True, last_chunk_arrival_time=float(i)) for i in range(5)]
    assert ids(FCFSPolicy().order(shuffled(prompts), CTX)) == ["r0", "r1", "r2", "r3", "r4"]


def test_fcfs_ignores_chunk_recency_and_progress():
    """Among partial prompts neither a fresh chunk nor computed tokens move a request: arrival order."""
    old = req("old", 1.0, last_chunk_arrival_time=99.0, num_computed_tokens=0)
    new = req("new", 2.0, last_chunk_arrival_time=3.0, num_computed_tokens=5000)
    assert ids(FCFSPolicy().order([new, old], CTX)) == ["old", "new"]


def test_fcfs_eviction_is_reverse_scheduling_order():
    """Eviction takes the last partial arrival first and the first completed request last."""
    policy = FCFSPolicy()
    evict = policy.eviction_order(policy.order(shuffled(_tiered_mix()), CTX))
    assert ids(evict) == ["p6", "p2", "p1", "c4", "c5", "c3"]


# --- lcas ---------------------------------------------------------------------------------


def test_lcas_complete_tier_first_most_recent_chunk_first():
    """Two tiers as FCFS, but each ordered by most recent last_chunk_arrival_time."""
    ranked = LCASPolicy(starvation_s=1e9).order(shuffled(_tiered_mix()), CTX)
    assert ids(ranked) == ["c4", "c5", "c3", "p2", "p1", "p6"]


def test_lcas_chunk_arrival_ties_broken_by_arrival():
    """Equal last chunk arrival: the earlier request first."""
    a = req("a", 5.0, last_chunk_arrival_time=50.0)
    b = req("b", 4.0, last_chunk_arrival_time=50.0)
    assert ids(LCASPolicy(starvation_s=1e9).order([a, b], CTX)) == ["b", "a"]


def test_lcas_eviction_takes_oldest_chunk_arrival_first():
    """Eviction is the reverse: partial tier with the stalest chunk goes first."""
    policy = LCASPolicy(starvation_s=1e9)
    evict = policy.eviction_order(policy.order(shuffled(_tiered_mix()), CTX))
    assert ids(evict) == ["p6", "p1", "p2", "c3", "c5", "c4"]


def _passed_over(rid: str, arrival: float, since: float, **fields) -> Request:
    """A waiting request passed over since `since` (queued since then too, as the scheduler keeps it)."""
    return req(rid, arrival, passed_over_since=since, queued_since=since, **fields)


def test_lcas_starved_requests_jump_ahead_of_both_tiers_oldest_first():
    """Passed over for more than starvation_s: ahead of everything, the longest-starved first."""
    policy = LCASPolicy(starvation_s=5.0)
    requests = [
        req("complete_fresh", 90.0, context_complete=True, last_chunk_arrival_time=99.0, queued_since=99.0),
        req("partial_fresh", 91.0, last_chunk_arrival_time=99.5, queued_since=99.5),
        _passed_over("starved_recent", 1.0, since=NOW - 6.0, last_chunk_arrival_time=2.0),
        _passed_over("starved_oldest", 2.0, since=NOW - 30.0, last_chunk_arrival_time=3.0),
    ]
    ranked = policy.order(shuffled(requests), PolicyContext(NOW))
    assert ids(ranked) == ["starved_oldest", "starved_recent", "complete_fresh", "partial_fresh"]


def test_lcas_request_just_under_the_starvation_bound_is_not_rescued():
    """Passed over for slightly less than starvation_s: stays in its tier (the bound is strict)."""
    policy = LCASPolicy(starvation_s=5.0)
    almost = _passed_over("almost", 1.0, since=NOW - 4.99, last_chunk_arrival_time=2.0)
    other = req("other", 50.0, last_chunk_arrival_time=99.0, queued_since=99.0)
    assert ids(policy.order([almost, other], PolicyContext(NOW))) == ["other", "almost"]



def test_lcas_rescues_a_running_request_passed_over_after_it_was_scheduled():
    """A RUNNING request (scheduled once, queued_since cleared) passed over too long is rescued."""
    policy = LCASPolicy(starvation_s=5.0)
    stalled = req(
        "stalled",
        1.0,
        state=RequestState.RUNNING,
        last_chunk_arrival_time=2.0,
        queued_since=None,
        passed_over_since=NOW - 20.0,
    )
    busy = req("busy", 3.0, state=RequestState.RUNNING, last_chunk_arrival_time=99.0, queued_since=None)
    assert ids(policy.order([busy, stalled], PolicyContext(NOW))) == ["stalled", "busy"]


def test_lcas_does_not_rescue_a_request_that_was_never_passed_over():
    """An old request that was never passed over (passed_over_since None) keeps its tier position."""
    policy = LCASPolicy(starvation_s=5.0)
    old = req("old", 1.0, last_chunk_arrival_time=2.0)  # queued_since defaults to arrival_time
    recent = req("recent", 90.0, last_chunk_arrival_time=99.0)
    assert old.passed_over_since is None
    assert ids(policy.order([old, recent], PolicyContext(NOW))) == ["recent", "old"]


_times = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@st.composite
def _lcas_requests(draw):
    n = draw(st.integers(min_value=0, max_value=12))
    out = []
    for i in range(n):
        arrival = draw(_times)
        r = req(
            f"r{i}",
            arrival,
            context_complete=draw(st.booleans()),
            last_chunk_arrival_time=arrival + draw(st.floats(0.0, 50.0)),
        )
        since = draw(st.none() | _times)
        # The scheduler keeps queued_since in step with passed_over_since for a waiting request.
        r.passed_over_since = r.queued_since = since
        out.append(r)
    return out


@settings(max_examples=300, deadline=None)
@given(requests=_lcas_requests(), now=st.floats(0.0, 200.0), starvation_s=st.floats(0.0, 50.0))
def test_lcas_no_starved_request_ranks_behind_a_non_starved_one(requests, now, starvation_s):
    """Property: every request passed over for more than starvation_s precedes every other one."""
    ranked = LCASPolicy(starvation_s=starvation_s).order(requests, PolicyContext(now))

    def starved(r):
        return r.passed_over_since is not None and now - r.passed_over_since > starvation_s

    flags = [starved(r) for r in ranked]
    assert flags == sorted(flags, reverse=True)
    rescued = [r.passed_over_since for r in ranked if starved(r)]
    assert rescued == sorted(rescued)


# --- mcps ---------------------------------------------------------------------------------


def test_mcps_most_computed_tokens_first_ties_by_arrival():
    """Highest num_computed_tokens first; equal progress goes by arrival; tiers are ignored."""
    requests = [
        req("a", 1.0, num_computed_tokens=10, context_complete=True),
        req("b", 2.0, num_computed_tokens=500),
        req("c", 3.0, num_computed_tokens=10),
        req("d", 0.5, num_computed_tokens=10),
        req("e", 4.0, num_computed_tokens=0, context_complete=True),
    ]
    ranked = MCPSPolicy().order(shuffled(requests), CTX)
    assert ids(ranked) == ["b", "d", "a", "c", "e"]


def test_mcps_eviction_removes_fewest_computed_first():
    """Eviction starts with the request that has computed the least."""
    policy = MCPSPolicy()
    requests = [
        req("big", 1.0, num_computed_tokens=900),
        req("none", 2.0, num_computed_tokens=0),
        req("mid", 3.0, num_computed_tokens=40),
    ]
    assert ids(policy.eviction_order(policy.order(requests, CTX))) == ["none", "mid", "big"]


# --- klpm ---------------------------------------------------------------------------------


def _klpm_mix():
    """Six requests, r0 oldest; cached prefixes chosen so age and match orders disagree."""
    prefix = {"r0": 0, "r1": 5, "r2": 300, "r3": 10, "r4": 200, "r5": 100}
    requests = [req(f"r{i}", float(i)) for i in range(6)]
    return requests, PolicyContext(NOW, cached_prefix_tokens=lambda r: prefix[r.request_id])


def test_klpm_k2_alternates_oldest_and_longest_prefix_match():
    """k=2: oldest, longest match, next oldest not taken, next longest match, ..."""
    requests, ctx = _klpm_mix()
    ranked = KLPMPolicy(k=2).order(shuffled(requests), ctx)
    # oldest r0; best match r2; oldest left r1; best left r4; oldest left r3; best left r5
    assert ids(ranked) == ["r0", "r2", "r1", "r4", "r3", "r5"]


def test_klpm_k3_takes_two_matches_per_oldest():
    """k=3: one oldest, then two longest matches, repeated."""
    requests, ctx = _klpm_mix()
    ranked = KLPMPolicy(k=3).order(shuffled(requests), ctx)
    assert ids(ranked) == ["r0", "r2", "r4", "r1", "r5", "r3"]


def test_klpm_k1_is_fcfs_by_arrival():
    """k=1: prefix matches are ignored, pure arrival order."""
    requests, ctx = _klpm_mix()
    assert ids(KLPMPolicy(k=1).order(shuffled(requests), ctx)) == ["r0", "r1", "r2", "r3", "r4", "r5"]


def test_klpm_huge_k_is_oldest_then_longest_prefix_match_order():
    """k much larger than the queue: the oldest, then everything else by longest match."""
    requests, ctx = _klpm_mix()
    ranked = KLPMPolicy(k=10_000).order(shuffled(requests), ctx)
    assert ids(ranked) == ["r0", "r2", "r4", "r5", "r3", "r1"]


def test_klpm_equal_matches_go_by_age():
    """Among equally long prefix matches the older request is picked first."""
    requests = [req(f"r{i}", float(i)) for i in range(4)]
    ctx = PolicyContext(NOW, cached_prefix_tokens=lambda r: 7)
    assert ids(KLPMPolicy(k=2).order(shuffled(requests), ctx)) == ["r0", "r1", "r2", "r3"]


@pytest.mark.parametrize("k", [0, -1])
def test_klpm_k_below_one_raises(k):
    """k must be at least 1."""
    with pytest.raises(ValueError):
        KLPMPolicy(k=k)


def test_klpm_default_context_has_no_prefix_matches():
    """Without a cached_prefix_tokens function every match is 0, so k-LPM is arrival order."""
    requests = [req(f"r{i}", float(i)) for i in range(5)]
    assert ids(KLPMPolicy(k=2).order(shuffled(requests), PolicyContext(NOW))) == [f"r{i}" for i in range(5)]


# --- every policy -------------------------------------------------------------------------


@st.composite
def _any_requests(draw):
    n = draw(st.integers(min_value=0, max_value=14))
    arrivals = draw(st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=n, max_size=n, unique=True))
    seqs = draw(st.permutations(list(range(n))))
    out = []
    for i, arrival in enumerate(arrivals):
        state = draw(st.sampled_from([RequestState.WAITING, RequestState.RUNNING, RequestState.SWAPPED]))
        r = req(
            f"r{i}",
            arrival,
            state=state,
            admitted_seq=seqs[i] if state is RequestState.RUNNING else -1,
            preempted_at=draw(st.none() | st.floats(0.0, 100.0)),
            context_complete=draw(st.booleans()),
            last_chunk_arrival_time=arrival + draw(st.floats(0.0, 50.0)),
            num_computed_tokens=draw(st.integers(0, 5000)),
        )
        r.passed_over_since = r.queued_since = draw(st.none() | st.floats(0.0, 100.0))
        out.append(r)
    prefix = {r.request_id: draw(st.integers(0, 4096)) for r in out}
    return out, prefix


def _policies(k: int):
    return [DefaultPolicy(), FCFSPolicy(), LCASPolicy(starvation_s=5.0), MCPSPolicy(), KLPMPolicy(k=k)]


@settings(max_examples=200, deadline=None)
@given(data=_any_requests(), now=st.floats(0.0, 200.0), k=st.integers(1, 6))
def test_every_policy_returns_a_deterministic_permutation_of_its_input(data, now, k):
    """Property: order() loses and duplicates nothing, leaves its input alone, and repeats itself."""
    requests, prefix = data
    ctx = PolicyContext(now, cached_prefix_tokens=lambda r: prefix[r.request_id])
    for policy in _policies(k):
        before = list(requests)
        first = policy.order(requests, ctx)
        assert requests == before, policy.name
        assert sorted(map(id, first)) == sorted(map(id, requests)), policy.name
        assert len({id(r) for r in first}) == len(first), policy.name
        assert policy.order(requests, ctx) == first, policy.name
        assert sorted(map(id, policy.eviction_order(first))) == sorted(map(id, first)), policy.name


# --- make_policy --------------------------------------------------------------------------


def test_make_policy_builds_each_registered_policy():
    """Every name in POLICIES gives an instance whose .name is that name."""
    for name in POLICIES:
        assert make_policy(name).name == name


def test_make_policy_unknown_name_lists_the_choices():
    """An unknown name raises ValueError naming every valid choice."""
    with pytest.raises(ValueError) as excinfo:
        make_policy("sjf")
    message = str(excinfo.value)
    assert "sjf" in message
    for name in POLICIES:
        assert name in message


def test_make_policy_passes_options_through():
    """Keyword options reach the policy's constructor."""
    lcas = make_policy("lcas", starvation_s=1.0)
    assert isinstance(lcas, LCASPolicy) and lcas.starvation_s == 1.0
    klpm = make_policy("klpm", k=4)
    assert isinstance(klpm, KLPMPolicy) and klpm.k == 4
    with pytest.raises(ValueError):
        make_policy("klpm", k=0)
