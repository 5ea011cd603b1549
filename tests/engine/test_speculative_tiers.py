"""Speculative prefill never delays complete work, and still progresses at saturation.

Prefill of a prompt still receiving context (no `finish` yet) is speculative. Under every
policy the scheduler serves complete prompts and decodes first, gives the partial tier at
most `speculative_share` of the budget per step, and keeps `speculative_reserve_share` of it for it
while complete work saturates the budget. Fake runner; no timing.
"""

from __future__ import annotations

import pytest

from inference_svc.engine.options import POLICY_CHOICES
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.scheduler import SchedulerConfig
from tests.engine.engine_helpers import capture_plans, expected_output, fake_engine, run_to_completion, tokens_of

ONE = SamplingParams(max_tokens=1)


def text(n: int, seed: str) -> list[Segment]:
    return [Segment(text=(seed * n)[:n])]


def partial_tokens(out) -> int:
    return sum(c.num_tokens for c in out.chunks if not c.request.context_complete)


def step_plans(engine, steps: int) -> list:
    """Run `steps` engine steps, capturing each step's scheduler output."""
    original = engine.scheduler.schedule
    outputs = capture_plans(engine)
    for _ in range(steps):
        engine.step()
    engine.scheduler.schedule = original
    return outputs


@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_a_complete_prompt_never_waits_behind_more_than_the_speculative_slice(policy):
    engine = fake_engine(policy=policy, budget=32, device_blocks=256, speculative_share=0.25,
                         speculative_reserve_share=0.0625)
    for i in range(4):                       # four long prompts still receiving context
        engine.open(f"partial-{i}", text(200, chr(ord("a") + i)), ONE)
    engine.open("complete", text(60, "z"), ONE)
    engine.finish("complete")
    outputs = step_plans(engine, 3)
    for out in outputs:
        assert partial_tokens(out) <= 8, "a step held more speculative tokens than the slice"
    first = outputs[0]
    scheduled = {c.request.request_id: c.num_tokens for c in first.chunks}
    # The complete prompt got the whole budget but the partial tier's reserve in the very first step.
    assert scheduled["complete"] == 32 - 2
    assert partial_tokens(first) == 2


@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_partial_prompts_progress_while_complete_ones_saturate_the_budget(policy):
    engine = fake_engine(policy=policy, budget=16, device_blocks=512, speculative_share=0.5,
                         speculative_reserve_share=0.25)
    engine.open("partial", text(100, "p"), ONE)
    for i in range(6):                        # complete work worth many full steps
        engine.open(f"c{i}", text(80, chr(ord("a") + i)), ONE)
        engine.finish(f"c{i}")
    step_plans(engine, 10)
    assert engine.requests["partial"].num_computed_tokens >= 10 * 4 - 4


@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_a_step_that_prefills_a_complete_prompt_holds_only_the_reserve_of_speculative_work(policy):
    engine = fake_engine(policy=policy, budget=64, device_blocks=256, speculative_share=0.5,
                         speculative_reserve_share=0.0625)
    for i in range(3):
        engine.open(f"partial-{i}", text(300, chr(ord("a") + i)), ONE)
    engine.open("complete", text(10, "z"), SamplingParams(max_tokens=4))
    engine.finish("complete")
    (out,) = step_plans(engine, 1)
    scheduled = {c.request.request_id: c.num_tokens for c in out.chunks}
    assert scheduled["complete"] == engine.requests["complete"].num_prompt_tokens
    assert partial_tokens(out) == 4                   # the reserve, not the 32-token slice
    (after,) = step_plans(engine, 1)                  # a decode step: the partial tier gets the slice again
    assert [c.request.request_id for c in after.chunks if c.request.context_complete] == ["complete"]
    assert partial_tokens(after) == 32


def test_without_complete_work_the_partial_tier_is_capped_by_the_slice_alone():
    engine = fake_engine(budget=32, device_blocks=256, speculative_share=0.375, speculative_reserve_share=0.125)
    engine.open("a", text(100, "a"), ONE)
    engine.open("b", text(100, "b"), ONE)
    (out,) = step_plans(engine, 1)
    assert partial_tokens(out) == 12


def test_the_tiers_off_restores_the_policy_order_alone():
    engine = fake_engine(policy="default", budget=32, device_blocks=256, speculative_share=None)
    engine.open("partial", text(100, "p"), ONE)
    engine.open("complete", text(40, "c"), ONE)
    engine.finish("complete")
    (out,) = step_plans(engine, 1)
    assert out.chunks[0].request.request_id == "partial"      # FIFO: the older one first


@pytest.mark.parametrize("deferral", [None, 0.0])
@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_results_stay_exact_under_the_tiers(policy, deferral):
    engine = fake_engine(policy=policy, budget=16, device_blocks=40, speculative_share=0.375,
                         speculative_reserve_share=0.125, speculative_deferral_s=deferral)
    prompts = {}
    for i in range(5):
        segments = text(30 + 7 * i, chr(ord("a") + i))
        engine.open(f"r{i}", segments, SamplingParams(max_tokens=4))
        prompts[f"r{i}"] = engine.requests[f"r{i}"].prompt_token_ids
    for _ in range(3):
        engine.step()
    for i in range(5):
        engine.finish(f"r{i}")
    events = run_to_completion(engine)
    for rid in prompts:
        full = engine.requests.get(rid)
        prompt = full.prompt_token_ids if full is not None else prompts[rid]
        assert tokens_of(events, rid) == expected_output(prompt, 4)
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks


def test_bad_tier_settings_are_rejected():
    with pytest.raises(ValueError):
        SchedulerConfig(speculative_share=0.25, speculative_reserve_share=0.5)
    with pytest.raises(ValueError):
        SchedulerConfig(speculative_deferral_s=-1.0)


# --- the deferral bound -------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("deferral", [None, 1.0])
@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_a_partial_prompt_waiting_past_the_deferral_bound_is_planned_as_complete_work(policy, deferral):
    clock = Clock()
    engine = fake_engine(policy=policy, budget=64, device_blocks=256, speculative_share=0.5,
                         speculative_reserve_share=0.0625, speculative_deferral_s=deferral, clock=clock)
    engine.open("partial", text(300, "p"), ONE)
    for i in range(4):                      # complete work that keeps the steps full
        engine.open(f"c{i}", text(100, chr(ord("a") + i)), ONE)
        engine.finish(f"c{i}")
    (before,) = step_plans(engine, 1)
    assert partial_tokens(before) == 4                     # speculative: the reserve only
    clock.now = 0.5
    (still,) = step_plans(engine, 1)
    assert partial_tokens(still) == 4                      # waited less than the bound
    clock.now = 1.0
    engine.open("late", text(100, "z"), ONE)               # complete after the partial prompt became due
    engine.finish("late")
    ranked = engine.scheduler.rank(clock.now)
    partial = engine.requests["partial"]
    due = engine.scheduler.policy_context(clock.now).is_due(partial)
    budget, in_order = 64, 0          # what the policy's order over every request gives it
    for r in ranked:
        n = min(r.num_schedulable_tokens, budget)
        budget -= n
        if r is partial:
            in_order = n
    (after,) = step_plans(engine, 1)
    if deferral is None:
        assert not due and partial_tokens(after) == 4
        return
    # Due: planned as complete work, in the policy's order over every request, no reserve apart.
    assert due and partial_tokens(after) == in_order
    assert sum(c.num_tokens for c in after.chunks) == 64
    if policy == "fcfs":                                   # served at the time it became due
        order = [r.request_id for r in ranked]
        assert order.index("partial") < order.index("late")


def test_fcfs_serves_a_due_partial_prompt_before_prompts_completed_after_it():
    clock = Clock()
    engine = fake_engine(policy="fcfs", budget=32, device_blocks=256, speculative_deferral_s=1.0, clock=clock)
    engine.open("partial", text(300, "p"), ONE)
    engine.scheduler.rank(clock.now)                       # the backlog starts waiting at t = 0
    clock.now = 1.5
    engine.open("late", text(100, "z"), ONE)
    engine.finish("late")
    assert [r.request_id for r in engine.scheduler.rank(clock.now)] == ["partial", "late"]
    clock.now = 0.9                                        # (before the bound: the complete prompt first)
    assert [r.request_id for r in engine.scheduler.rank(clock.now)] == ["late", "partial"]


def test_a_partial_prompt_with_nothing_left_to_compute_starts_waiting_afresh():
    clock = Clock()
    engine = fake_engine(policy="fcfs", budget=64, device_blocks=256, speculative_share=1.0,
                         speculative_deferral_s=1.0, clock=clock)
    engine.open("partial", text(20, "p"), ONE)
    step_plans(engine, 1)                                  # all of it computed: no backlog
    engine.scheduler.rank(clock.now)
    assert engine.requests["partial"].backlog_since is None
    clock.now = 5.0
    engine.append("partial", text(20, "q"))
    engine.scheduler.rank(clock.now)
    assert engine.requests["partial"].backlog_since == 5.0


# --- update mode: stability hints ---------------------------------------------------------

def doc(text: str, stability: float | None = None) -> Segment:
    return Segment(text=text, key=text[:4], stability=stability)


def test_an_unfinal_update_prefills_only_its_stable_prefix_until_the_final_stage():
    engine = fake_engine(budget=64, device_blocks=256)
    engine.open("q", [Segment(text="HEAD")], ONE)
    engine.update("q", [doc("stable-one "), doc("stable-two "), doc("new-maybe-gone ", 0.2), doc("tail ")],
                  final=False)
    request = engine.requests["q"]
    limit = len("HEAD") + len("stable-one stable-two ")       # the char tokenizer: one token per character
    assert request.speculative_limit == limit
    for _ in range(5):
        engine.step()
    assert request.num_computed_tokens == limit, "the likely-replaced tail was prefilled ahead"
    assert not request.is_runnable                              # nothing to do: the engine does not spin
    engine.update("q", [doc("stable-one "), doc("stable-two "), doc("kept-now ")], final=True)
    assert request.speculative_limit is None and request.is_runnable
    for _ in range(5):
        engine.step()
    assert request.num_computed_tokens == request.num_prompt_tokens


def test_the_stability_aware_update_path_leaves_greedy_results_exact():
    engine = fake_engine(budget=8, device_blocks=64)
    engine.open("q", [Segment(text="HEAD ")], SamplingParams(max_tokens=5))
    engine.update("q", [doc("alpha "), doc("beta ", 0.1)], final=False)
    engine.step()
    engine.update("q", [doc("alpha "), doc("gamma ", 0.3), doc("delta ")], final=False)
    engine.step()
    engine.update("q", [doc("alpha "), doc("gamma "), doc("delta ")], final=True)
    engine.finish("q", [Segment(text=" ANSWER:")])
    prompt = list(engine.requests["q"].prompt_token_ids)
    events = run_to_completion(engine)
    assert tokens_of(events, "q") == expected_output(prompt, 5)
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks


def test_the_cost_model_discounts_kv_that_refinements_keep_invalidating():
    from inference_svc.engine.cost_model import CostModel, PiecewiseLinear

    model = CostModel(PiecewiseLinear([0, 1000], [0.0, 100.0]), PiecewiseLinear([0, 100], [0.0, 10.0]))
    # 500 tokens: recompute 50 ms against 2 x 5 ms of swap: swap, unless most of that KV is going to be invalid
    assert not model.prefer_recompute(500, 50)
    assert model.prefer_recompute(500, 50, keep_fraction=0.1)
