"""Speculative prefill never delays complete work, and still progresses at saturation.

Prefill of a prompt still receiving context (no `finish` yet) is speculative. Under every
policy the scheduler serves complete prompts and decodes first, gives the partial tier at
most `speculative_share` of the budget per step for prefill a refinement may replace (update
mode before the final stage) and at most `speculative_append_share` for append-mode prompts,
and keeps `speculative_reserve_share` of it for them while complete work saturates the budget.
Fake runner; no timing.
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


def open_refining(engine, request_id: str, n: int, seed: str) -> None:
    """An update-mode prompt before its final stage: what it prefills ahead a refinement may replace."""
    engine.open(request_id, [], ONE)
    engine.update(request_id, text(n, seed), final=False)


@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_a_complete_prompt_never_waits_behind_more_than_the_speculative_slice(policy):
    engine = fake_engine(policy=policy, budget=32, device_blocks=256, speculative_share=0.25,
                         speculative_reserve_share=0.0625)
    for i in range(4):                       # four long update-mode prompts still receiving context
        open_refining(engine, f"partial-{i}", 200, chr(ord("a") + i))
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
        open_refining(engine, f"partial-{i}", 300, chr(ord("a") + i))
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
    open_refining(engine, "a", 100, "a")
    open_refining(engine, "b", 100, "b")
    (out,) = step_plans(engine, 1)
    assert partial_tokens(out) == 12


@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_append_mode_prompts_use_their_own_share_and_update_mode_ones_stay_in_the_slice(policy):
    # Prefill ahead of an append-mode prompt is work it needs anyway: it may fill the step (share 1.0,
    # the default), while prefill that a refinement may replace stays within `speculative_share`.
    engine = fake_engine(policy=policy, budget=32, device_blocks=256, speculative_share=0.25,
                         speculative_reserve_share=0.0625)
    open_refining(engine, "refining-1", 100, "r")
    engine.open("growing", text(100, "g"), ONE)
    open_refining(engine, "refining-2", 100, "s")
    (out,) = step_plans(engine, 1)
    scheduled = {c.request.request_id: c.num_tokens for c in out.chunks}
    assert out.num_tokens == 32, "append-mode work left part of the step empty"
    assert scheduled.get("refining-1", 0) + scheduled.get("refining-2", 0) <= 8
    assert scheduled["growing"] >= 24
    # With the append share at the slice, the step holds the old cap of speculative work.
    engine = fake_engine(policy=policy, budget=32, device_blocks=256, speculative_share=0.25,
                         speculative_reserve_share=0.0625, speculative_append_share=0.25)
    engine.open("growing", text(100, "g"), ONE)
    open_refining(engine, "refining", 100, "r")
    (out,) = step_plans(engine, 1)
    assert partial_tokens(out) == 8


@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_a_final_stage_update_lifts_the_slice(policy):
    engine = fake_engine(policy=policy, budget=32, device_blocks=256, speculative_share=0.25,
                         speculative_reserve_share=0.0625)
    open_refining(engine, "q", 100, "q")
    (out,) = step_plans(engine, 1)
    assert partial_tokens(out) == 8
    engine.update("q", text(100, "q"), final=True)    # nothing replaces it any more: append-mode rules
    (out,) = step_plans(engine, 1)
    assert partial_tokens(out) == 32


def test_the_tiers_off_restores_the_policy_order_alone():
    engine = fake_engine(policy="default", budget=32, device_blocks=256, speculative_share=None)
    engine.open("partial", text(100, "p"), ONE)
    engine.open("complete", text(40, "c"), ONE)
    engine.finish("complete")
    (out,) = step_plans(engine, 1)
    assert out.chunks[0].request.request_id == "partial"      # FIFO: the older one first


@pytest.mark.parametrize("policy", POLICY_CHOICES)
def test_results_stay_exact_under_the_tiers(policy):
    engine = fake_engine(policy=policy, budget=16, device_blocks=40, speculative_share=0.375,
                         speculative_reserve_share=0.125)
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
        SchedulerConfig(speculative_reserve_share=0.25, speculative_append_share=0.125)
    with pytest.raises(ValueError, match="eviction"):
        SchedulerConfig(eviction="sometimes")


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
