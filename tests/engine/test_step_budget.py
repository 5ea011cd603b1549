"""Steps bounded in time (step_budget.py): the token budget the step-time model gives for a target,
and its online refit from measured steps (synthetic step records: no clock, no model)."""

from __future__ import annotations

import pytest

from inference_svc.engine.cost_model import CostModel, PiecewiseLinear
from inference_svc.engine.options import step_time_target_arg
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.step_budget import MIN_STEP_TOKENS, StepBudget, StepScale
from tests.engine.engine_helpers import fake_engine, run_to_completion

LINEAR = PiecewiseLinear([0, 100_000], [10.0, 100_010.0])       # 10 ms per step, then 1 ms per token
# attention makes tokens deep in a prompt cost more: 1 ms/token over the first 1,000, 2 ms after
CONVEX = PiecewiseLinear([0, 1000, 100_000], [10.0, 1010.0, 199_010.0])


def budget_for(curve, target=250.0, cap=2048, scale=1.0) -> StepBudget:
    return StepBudget(curve, target, cap, scale=StepScale(value=scale))


def test_the_budget_is_what_the_model_fits_in_the_target():
    b = budget_for(LINEAR)
    assert b.tokens_for(0) == 240                         # 10 ms fixed + 240 x 1 ms = 250 ms
    assert b.predict_ms([(0, 240)]) == pytest.approx(250.0)
    assert b.predict_ms([(0, 241)]) > 250.0


def test_a_chunk_deep_in_a_prompt_gets_fewer_tokens_when_attention_makes_it_dearer():
    b = budget_for(CONVEX)
    assert b.tokens_for(0) == 240
    assert b.tokens_for(5000) == 120                      # 2 ms per token there
    assert b.tokens_for(900) == 100 + (240 - 100) // 2    # 100 tokens at 1 ms, the rest at 2 ms


def test_the_budget_stays_between_the_floor_and_the_configured_cap():
    assert budget_for(LINEAR, target=100_000.0, cap=512).tokens_for(0) == 512
    tiny = budget_for(LINEAR, target=5.0)                 # less than the fixed cost
    assert tiny.tokens_for(0) == 0
    engine = fake_engine(budget=64)
    engine.open("r", [Segment(text="x" * 100)], SamplingParams(max_tokens=1))
    engine.finish("r")
    assert tiny.budget(engine.requests.values()) == MIN_STEP_TOKENS
    assert budget_for(LINEAR, cap=8).budget(engine.requests.values()) == 8


def test_decodes_count_in_the_budget_and_alone_are_not_cut():
    engine = fake_engine(budget=4096, device_blocks=512)
    for i in range(3):
        engine.open(f"d{i}", [Segment(text="ab" * 20)], SamplingParams(max_tokens=50))
        engine.finish(f"d{i}")
    engine.step()                                          # all three prefilled: they decode now
    b = budget_for(LINEAR, cap=4096)
    assert b.budget(engine.requests.values()) == 4096     # decodes only: nothing to bound
    engine.open("p", [Segment(text="x" * 1000)], SamplingParams(max_tokens=1))
    engine.finish("p")
    assert b.budget(engine.requests.values()) == 240      # 3 decodes at 1 ms + 237 prefill tokens


def test_refit_shrinks_the_budget_when_steps_run_slower_than_predicted():
    b = budget_for(LINEAR)
    before = b.tokens_for(0)
    predicted = b.observe([(0, before)], 500.0)           # took twice the target
    assert predicted == pytest.approx(250.0)
    assert b.scale.value > 1
    assert b.tokens_for(0) < before


def test_refit_grows_the_budget_when_steps_run_faster_than_predicted():
    b = budget_for(LINEAR)
    before = b.tokens_for(0)
    b.observe([(0, before)], 125.0)
    assert b.scale.value < 1
    assert b.tokens_for(0) > before


@pytest.mark.parametrize("slower", [0.5, 3.0, 8.0])
def test_repeated_refits_converge_on_the_machine_s_real_speed(slower):
    """The machine is this many times slower than the profile: steps sized by the budget converge on
    the target (no bound on how far off the profile may be: 8x slower is 8x)."""
    b = budget_for(LINEAR)
    for _ in range(60):
        n = b.tokens_for(0)
        b.observe([(0, n)], slower * (10.0 + n))           # what the real machine takes
    n = b.tokens_for(0)
    assert slower * (10.0 + n) == pytest.approx(250.0, rel=0.03)
    assert b.scale.value == pytest.approx(slower, rel=0.03)


def test_one_stalled_step_moves_the_budget_only_so_far():
    b = budget_for(LINEAR)
    b.observe([(0, 240)], 1e9)                             # a step stalled by other work on the machine
    assert b.tokens_for(0) > 0


def test_engine_uses_the_budget_and_reports_it():
    """An engine with a target schedules within the model's budget each step and reports it."""
    engine = fake_engine(budget=64, device_blocks=256, step_time_target_ms=250.0)
    engine.step_budget.curve = PiecewiseLinear([0, 100_000], [10.0, 1_000_010.0])   # 10 ms per token
    engine.step_budget.scale = StepScale(alpha=0.0)     # no refit: the budget is the model's alone
    engine.open("r", [Segment(text="x" * 200)], SamplingParams(max_tokens=2, ignore_eos=True))
    engine.finish("r")
    prefill = []
    while engine.has_unfinished():
        engine.step()
        last = engine.last_step
        if last.decode_tokens < last.tokens:
            prefill.append(last.tokens)
            assert last.budget == 24                      # (250 - 10) / 10
            assert last.predicted_ms == pytest.approx(10 + 10 * last.tokens)
        else:
            assert last.budget == 64                      # decodes alone: the cap
    assert prefill == [24] * 8 + [8]
    assert engine.scheduler.kv.device.num_free == engine.scheduler.kv.device.num_blocks


def test_without_a_target_every_step_gets_the_configured_budget():
    engine = fake_engine(budget=32)
    assert engine.step_budget is None
    engine.open("r", [Segment(text="x" * 100)], SamplingParams(max_tokens=1))
    engine.finish("r")
    run_to_completion(engine)
    assert engine.last_step.budget == 32


def test_builtin_cost_model_gives_a_budget():
    b = StepBudget.from_cost_model(CostModel.builtin(), 250.0, 2048)
    assert 0 < b.tokens_for(0) < 2048


def test_the_target_flag_takes_ms_or_off():
    assert step_time_target_arg("250") == 250.0
    assert step_time_target_arg("off") is None
    for bad in ("0", "-5", "fast"):
        with pytest.raises(ValueError):
            step_time_target_arg(bad)


def test_the_service_bounds_steps_by_default_and_passes_the_flag_to_the_engine(tmp_path):
    import argparse

    from inference_svc.engine.options import DEFAULT_STEP_TIME_TARGET_MS
    from inference_svc.server import native_spec
    from inference_svc.server_args import add_inference_args

    parser = argparse.ArgumentParser()
    add_inference_args(parser)
    assert native_spec(parser.parse_args([]), tmp_path).engine.step_time_target_ms == DEFAULT_STEP_TIME_TARGET_MS
    args = parser.parse_args(["--step-time-target-ms", "off"])
    assert native_spec(args, tmp_path).engine.step_time_target_ms is None
    assert parser.parse_args(["--step-time-target-ms", "100"]).step_time_target_ms == 100.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--step-time-target-ms", "0"])
