"""Engine semantics over the fake runner: streaming input, LCP reuse, preemption, no leaks.

The fake runner predicts from the KV it reads back, so matching outputs prove the KV
cache held exactly the right tokens. The real model runs the same scenarios in
test_engine_real_model.py.
"""

from __future__ import annotations

import pytest

from inference_svc.engine.engine import (
    DuplicateRequestError,
    EngineInputError,
    PromptTooLongError,
    UnknownRequestError,
)
from inference_svc.engine.events import EventKind
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from tests.engine.engine_helpers import GREEDY, expected_output, fake_engine, run_to_completion, tokens_of

HEAD = [Segment(text="You answer questions. Question: what is X? ")]
DOCS = [Segment(text=f"[doc {i}] " + "lorem " * (i + 1), key=f"d{i}") for i in range(4)]
SUFFIX = [Segment(text=" Answer:")]


def prompt_tokens(engine, segments) -> list[int]:
    return engine.tokenizer.encode_all(segments)


def test_one_shot_answer_matches_the_reference():
    engine = fake_engine()
    engine.open("r", HEAD + DOCS, GREEDY)
    engine.finish("r", SUFFIX)
    events = run_to_completion(engine)
    assert tokens_of(events, "r") == expected_output(prompt_tokens(engine, HEAD + DOCS + SUFFIX), 6)


def test_streamed_appends_give_the_one_shot_answer_and_prefill_before_finish():
    engine = fake_engine()
    engine.open("r", HEAD, GREEDY)
    for doc in DOCS:
        engine.append("r", [doc])
        for _ in range(20):
            assert not tokens_of(engine.step(), "r"), "decoded before finish"
    request = engine.requests["r"]
    assert request.num_computed_tokens == request.num_prompt_tokens  # all context prefilled already
    engine.finish("r", SUFFIX)
    events = run_to_completion(engine)
    assert tokens_of(events, "r") == expected_output(prompt_tokens(engine, HEAD + DOCS + SUFFIX), 6)
    assert request.stats.tokens_computed == request.num_prompt_tokens + 5  # nothing computed twice


def test_update_replacing_a_middle_document_keeps_kv_up_to_the_lcp():
    engine = fake_engine()
    engine.open("r", HEAD, GREEDY)
    engine.update("r", DOCS[:3])
    for _ in range(30):
        engine.step()
    old = engine.requests["r"].num_computed_tokens
    new_docs = [DOCS[0], Segment(text="[doc X] replaced text", key="dx"), DOCS[2]]
    lcp = len(prompt_tokens(engine, HEAD + DOCS[:1])) + len(prompt_tokens(engine, [Segment(text="[doc ")]))
    engine.update("r", new_docs)
    assert engine.requests["r"].num_computed_tokens == lcp
    assert engine.requests["r"].stats.tokens_invalidated == old - lcp
    engine.finish("r", SUFFIX)
    events = run_to_completion(engine)
    invalidated = [e for e in events if e.kind is EventKind.INVALIDATED]
    assert [e.count for e in invalidated] == [old - lcp]
    assert tokens_of(events, "r") == expected_output(prompt_tokens(engine, HEAD + new_docs + SUFFIX), 6)


@pytest.mark.parametrize("eviction", ["recompute", "swap", "cost"])
@pytest.mark.parametrize("policy", ["default", "fcfs", "lcas", "mcps", "klpm"])
def test_memory_pressure_preempts_yet_answers_stay_exact(policy, eviction):
    engine = fake_engine(device_blocks=40, cpu_blocks=200, policy=policy, eviction=eviction, budget=24)
    prompts, events = {}, []
    for i in range(6):
        rid = f"r{i}"
        engine.open(rid, HEAD, SamplingParams(max_tokens=5))
        docs = [DOCS[(i + j) % 4] for j in range(3)]
        for doc in docs:
            engine.append(rid, [doc])
            events += engine.step()
        engine.finish(rid, SUFFIX)
        prompts[rid] = prompt_tokens(engine, HEAD + docs + SUFFIX)
    events += run_to_completion(engine)
    for rid, prompt in prompts.items():
        assert tokens_of(events, rid) == expected_output(prompt, 5), rid
    preemptions = engine.counters.preemptions_swap + engine.counters.preemptions_recompute
    assert preemptions > 0
    if eviction == "recompute":
        assert engine.counters.preemptions_swap == 0
    if eviction == "swap":
        assert engine.counters.preemptions_recompute == 0
    engine.scheduler.kv.check_invariants()
    assert engine.scheduler.kv.device.num_free == 40 and engine.scheduler.kv.cpu.num_free == 200


def test_cost_mode_recomputes_when_the_model_says_recompute_is_cheap():
    from inference_svc.engine.cost_model import CostModel, PiecewiseLinear

    engine = fake_engine(device_blocks=40, cpu_blocks=200, eviction="cost", budget=24)
    engine.cost_model = engine.scheduler.cost_model = CostModel(
        PiecewiseLinear([0, 1000], [0, 1]), PiecewiseLinear([0, 10], [0, 1000])
    )  # swapping is slow
    for i in range(6):
        engine.open(f"r{i}", [Segment(text=f"{i}"), *HEAD, *DOCS[:3]], SamplingParams(max_tokens=5))
        engine.finish(f"r{i}", SUFFIX)
    run_to_completion(engine)
    assert engine.counters.preemptions_recompute > 0 and engine.counters.preemptions_swap == 0


def test_update_of_a_swapped_request_invalidates_its_cpu_copy():
    engine = fake_engine(device_blocks=40, cpu_blocks=200, eviction="swap", budget=64, policy="lcas")
    engine.open("old", HEAD, GREEDY)
    engine.append("old", DOCS[:3])
    for _ in range(10):
        engine.step()
    engine.open("new", HEAD + DOCS[1:4], GREEDY)  # fresher: lcas ranks it first and evicts "old"
    engine.finish("new", SUFFIX)
    engine.step()
    assert engine.requests["old"].state.value == "swapped"
    cpu_before = engine.scheduler.kv.num_cpu_blocks("old")
    engine.update("old", DOCS[:1])
    assert engine.scheduler.kv.num_cpu_blocks("old") < cpu_before
    engine.finish("old", SUFFIX)
    events = run_to_completion(engine)
    assert tokens_of(events, "old") == expected_output(prompt_tokens(engine, HEAD + DOCS[:1] + SUFFIX), 6)
    assert engine.scheduler.kv.device.num_free == 40 and engine.scheduler.kv.cpu.num_free == 200


def test_shared_preamble_is_computed_once():
    engine = fake_engine(budget=256)
    engine.open("a", HEAD + DOCS, GREEDY)
    engine.finish("a", SUFFIX)
    run_to_completion(engine)
    engine.open("b", HEAD + DOCS, GREEDY)
    engine.finish("b", [Segment(text=" Different suffix:")])
    events = run_to_completion(engine)
    b = engine.requests["b"]
    assert b.stats.prefix_cache_hit_tokens >= len(prompt_tokens(engine, HEAD + DOCS)) - 4
    assert tokens_of(events, "b") == expected_output(b.prompt_token_ids, 6)


def test_lifecycle_events_in_order():
    engine = fake_engine()
    engine.open("r", HEAD, GREEDY)
    engine.finish("r", SUFFIX)
    kinds = [e.kind for e in run_to_completion(engine) if e.kind is not EventKind.TOKEN]
    assert kinds == [
        EventKind.QUEUED,
        EventKind.SCHEDULED,
        EventKind.KV_ON_GPU,
        EventKind.FIRST_TOKEN,
        EventKind.FINISHED,
    ]


def test_abort_frees_every_block():
    engine = fake_engine(device_blocks=64)
    engine.open("r", HEAD + DOCS[:2], GREEDY)
    engine.step()
    assert engine.scheduler.kv.device.num_free < 64
    engine.abort("r")
    assert engine.scheduler.kv.device.num_free == 64
    assert engine.requests["r"].finish_reason.value == "abort"


def test_stats_report_ttft_from_open_and_from_last_input():
    clock = iter(range(1000))
    engine = fake_engine()
    engine.clock = engine.scheduler.clock = lambda: float(next(clock))
    engine.open("r", HEAD, GREEDY)
    engine.append("r", DOCS[:1])
    engine.finish("r", SUFFIX)
    run_to_completion(engine)
    stats = engine.requests["r"].stats
    assert stats.ttft_from_open_s > stats.ttft_from_last_input_s > 0


def test_bad_input_raises_clear_errors_and_changes_nothing():
    engine = fake_engine(device_blocks=8)
    engine.open("r", [Segment(text="hi")], GREEDY)
    with pytest.raises(DuplicateRequestError):
        engine.open("r", [Segment(text="x")], GREEDY)
    with pytest.raises(UnknownRequestError):
        engine.append("nope", [Segment(text="x")])
    with pytest.raises(PromptTooLongError):
        engine.append("r", [Segment(text="x" * 100)])  # 8 blocks x 4 tokens
    assert engine.requests["r"].num_prompt_tokens == 2
    with pytest.raises(EngineInputError, match="temperature"):
        engine.open("s", [Segment(text="x")], SamplingParams(temperature=-1))
    engine.finish("r", [])
    with pytest.raises(EngineInputError, match="finished"):
        engine.append("r", [Segment(text="late")])
    engine.open("e", [], GREEDY)
    with pytest.raises(EngineInputError, match="empty"):
        engine.finish("e", [])
    engine.abort("e")
    run_to_completion(engine)
    assert engine.scheduler.kv.device.num_free == 8


def test_finish_without_suffix_after_full_prefill_still_answers():
    engine = fake_engine(budget=256)
    engine.open("a", HEAD + DOCS, GREEDY)                 # a shares b's full blocks via the prefix cache
    engine.open("b", HEAD + DOCS, GREEDY)
    for _ in range(10):
        engine.step()
    assert engine.requests["b"].num_pending_tokens == 0
    engine.finish("b")                                    # nothing added: the last token must run again
    engine.finish("a", SUFFIX)
    events = run_to_completion(engine)
    assert tokens_of(events, "b") == expected_output(prompt_tokens(engine, HEAD + DOCS), 6)
    assert tokens_of(events, "a") == expected_output(prompt_tokens(engine, HEAD + DOCS + SUFFIX), 6)
    engine.scheduler.kv.check_invariants()


def test_input_arrival_time_given_by_the_caller_is_what_ttft_counts_from():
    """A caller on another thread stamps input when it arrives; the wait for a running step counts."""
    clock = iter(range(100, 1000))
    engine = fake_engine()
    engine.clock = engine.scheduler.clock = lambda: float(next(clock))
    engine.open("r", HEAD, GREEDY, arrived_at=50.0)
    engine.finish("r", SUFFIX, arrived_at=60.0)      # received at 60, applied later
    run_to_completion(engine)
    stats = engine.requests["r"].stats
    assert (stats.arrival_time, stats.last_input_time) == (50.0, 60.0)
    assert stats.ttft_from_last_input_s == stats.first_token_time - 60.0
