"""The scheduler class itself (inference_svc/vllm_backend/scheduler.py) on vLLM's own Request and
KV cache manager, stepped by hand (no model, no engine process): which request it preempts when
a higher-priority one needs room.

    /opt/vllm-venv/bin/python -m pytest --run-vllm -m vllm tests/service/test_vllm_scheduler_class.py

Two partial prompts are mid-prefill (512 of 1,200 tokens each, 4 blocks each of a 20-block pool),
then a complete 1,600-token prompt (13 blocks) arrives with 11 blocks free: the class must free
room by preempting the lowest priority of the two, and hold the other back for the step.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

BLOCK = 128
NUM_BLOCKS = 20
BUDGET = 1024


def make_scheduler(model_dir, policy: str):
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from inference_svc.vllm_backend.config import POLICY_KEY
    from inference_svc.vllm_backend.scheduler import PolicyStreamingSyncScheduler

    args = EngineArgs(model=str(model_dir), tokenizer=str(model_dir), dtype="float32", enforce_eager=True,
                      enable_prefix_caching=False, block_size=BLOCK, max_num_batched_tokens=BUDGET, max_num_seqs=8,
                      long_prefill_token_threshold=512, scheduling_policy="fcfs",
                      additional_config={POLICY_KEY: policy})
    config = args.create_engine_config()
    config.cache_config.num_gpu_blocks = NUM_BLOCKS
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return PolicyStreamingSyncScheduler(vllm_config=config, kv_cache_config=kv, block_size=BLOCK,
                                        structured_output_manager=StructuredOutputManager(config), log_stats=True)


def make_request(rid: str, tokens: int, arrival: float, complete: bool):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from inference_svc.vllm_backend.ranking import stream_marks

    params = SamplingParams(max_tokens=1, extra_args=stream_marks(complete, chunk_at=arrival))
    return Request(rid, list(range(100, 100 + tokens)), params, None, arrival_time=arrival)


@pytest.mark.parametrize(("policy", "victim", "kept"), [("fcfs", "later", "earlier"), ("lcas", "earlier", "later")])
def test_preemption_takes_the_lowest_priority_first(embedded_model_dir, policy, victim, kept):
    from vllm.v1.request import RequestStatus

    scheduler = make_scheduler(embedded_model_dir, policy)
    earlier = make_request("earlier", 1200, 1.0, complete=False)
    later = make_request("later", 1200, 2.0, complete=False)
    pool = scheduler.kv_cache_manager.block_pool
    free = pool.get_num_free_blocks()                                  # the pool keeps one null block
    for request in (earlier, later):
        scheduler.add_request(request)
    first = scheduler.schedule()
    assert first.num_scheduled_tokens == {"earlier": 512, "later": 512}
    assert pool.get_num_free_blocks() == free - 8 < 13                 # the complete prompt below needs 13
    # (no model: the step's output is not fed back; these were prefill chunks, they sample nothing)

    complete = make_request("complete", 1600, 3.0, complete=True)
    scheduler.add_request(complete)
    second = scheduler.schedule()
    requests = {"earlier": earlier, "later": later}
    assert requests[victim].status is RequestStatus.PREEMPTED          # the lowest priority of the two
    assert requests[victim].num_computed_tokens == 0                   # recompute
    assert requests[kept].status is RequestStatus.RUNNING and requests[kept].num_computed_tokens == 512
    assert "complete" in second.num_scheduled_tokens                   # the complete prompt overtook them
    assert kept not in second.num_scheduled_tokens                     # held back this step, KV kept
    assert scheduler.running[0].request_id == "complete"              # ranked first from now on


@pytest.mark.parametrize(("policy", "served", "held"), [("fcfs", "earlier", "later"), ("lcas", "later", "earlier")])
def test_an_overtaking_request_leaves_the_rest_of_the_budget_to_the_next_in_rank(embedded_model_dir, policy,
                                                                                   served, held):
    """A short complete prompt overtakes two partial prefills; only as much lower-ranked work is held
    back as it needs: the higher-ranked partial prefill still gets its chunk in the same step (the
    step is not spent on the short prompt alone), the lower-ranked one waits, keeping its KV."""
    from vllm.v1.request import RequestStatus

    scheduler = make_scheduler(embedded_model_dir, policy)
    earlier = make_request("earlier", 1200, 1.0, complete=False)
    later = make_request("later", 1200, 2.0, complete=False)
    for request in (earlier, later):
        scheduler.add_request(request)
    scheduler.schedule()                                               # 512 tokens each
    short = make_request("short", 100, 3.0, complete=True)
    scheduler.add_request(short)
    step = scheduler.schedule()
    requests = {"earlier": earlier, "later": later}
    assert step.num_scheduled_tokens.get("short") == 100               # overtook both
    assert step.num_scheduled_tokens.get(served) == 512                # budget left: 1,024 - 100 > 688 pending
    assert held not in step.num_scheduled_tokens                       # 688 more would not fit behind it
    assert requests[held].status is RequestStatus.RUNNING and requests[held].num_computed_tokens == 512
    assert not step.preempted_req_ids                                  # the pool holds all three


@pytest.mark.parametrize("policy", ["fcfs", "lcas"])
def test_every_waiting_complete_prompt_counts_against_partial_prefills(embedded_model_dir, policy):
    """Two complete prompts wait behind two running partial prefills: the class holds back partial
    work until both complete prompts fit in the step, not only the first (a partial prefill that
    would fit beside the first alone still waits), and the partial prompts keep their KV."""
    from vllm.v1.request import RequestStatus

    scheduler = make_scheduler(embedded_model_dir, policy)
    partials = [make_request("earlier", 1200, 1.0, complete=False), make_request("later", 1200, 2.0, complete=False)]
    for request in partials:
        scheduler.add_request(request)
    scheduler.schedule()                                               # 512 tokens each, 688 pending each
    for rid, arrival in (("a", 3.0), ("b", 3.5)):
        scheduler.add_request(make_request(rid, 300, arrival, complete=True))
    step = scheduler.schedule()
    assert step.num_scheduled_tokens.get("a") == 300
    assert step.num_scheduled_tokens.get("b") == 300                  # whole, not the budget's remainder
    assert not {"earlier", "later"} & set(step.num_scheduled_tokens)   # 688 pending > 1,024 - 600 left
    for request in partials:
        assert request.status is RequestStatus.RUNNING and request.num_computed_tokens == 512


@pytest.mark.parametrize(("policy", "first"), [("fcfs", "early"), ("lcas", "late")])
def test_a_complete_prefill_gives_way_to_a_waiting_prompt_the_policy_ranks_above_it(embedded_model_dir, policy,
                                                                                    first):
    """A running prompt's context completes (its finish turn) after a waiting prompt's did. Under fcfs
    the waiting one ranks first (the order non-streaming receives them in), so the running prefill,
    although complete, sits the step out while the waiting prompt takes the budget; under lcas (most
    recent chunk first) the running one keeps its turn and the waiting one gets the rest. (fcfs fails on the
    class of session 14, which held back only partial prefills: the running prefill went first.)"""
    from vllm import SamplingParams
    from vllm.v1.request import RequestStatus

    from inference_svc.vllm_backend.ranking import stream_marks

    scheduler = make_scheduler(embedded_model_dir, policy)
    late = make_request("late", 1900, 1.0, complete=False)
    scheduler.add_request(late)
    scheduler.schedule()                                               # 1,024 of 1,900 computed
    scheduler.add_request(make_request("early", 500, 4.0, complete=True))    # its context completed at 4.0
    late.sampling_params = SamplingParams(max_tokens=1, extra_args=stream_marks(True, chunk_at=5.0))  # at 5.0
    step = scheduler.schedule()
    if first == "early":
        assert step.num_scheduled_tokens.get("early") == 500
        assert "late" not in step.num_scheduled_tokens                 # 876 more would not fit beside it
        assert late.status is RequestStatus.RUNNING and late.num_computed_tokens == 1024   # keeps its KV
    else:
        assert step.num_scheduled_tokens.get("late") == 512                # its turn (the long-prefill chunk)
        assert step.num_scheduled_tokens.get("early") == 500               # and the waiting one the rest


def test_the_step_log_times_each_step_inside_the_engine_process(embedded_model_dir, tmp_path, monkeypatch):
    """With STREAMRAG_VLLM_STEP_LOG set, each step's line carries what the class scheduled and where the
    engine process's time went (its schedule() call, update_from_output, the garbage collector)."""
    import json

    from inference_svc.vllm_backend.scheduler import STEP_LOG_ENV

    monkeypatch.setenv(STEP_LOG_ENV, str(tmp_path / "steps"))
    scheduler = make_scheduler(embedded_model_dir, "fcfs")
    scheduler.add_request(make_request("r", 300, 1.0, complete=True))
    scheduler.schedule()
    scheduler.schedule()
    (log,) = tmp_path.glob("steps.*.jsonl")
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 2
    assert lines[0]["scheduled"] == {"r": 300} and lines[0]["complete"] == ["r"]
    for line in lines:
        assert line["schedule_ms"] >= 0 and line["update_ms"] == 0 and line["gc_ms"] >= 0
