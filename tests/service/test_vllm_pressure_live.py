"""Idle streaming sessions that hold every KV block do not stall a complete prompt on vLLM: our
policy's service evicts the lowest-ranked idle session (inference_svc/vllm_backend/pressure.py),
and the evicted session still answers exactly like Generate once its context is complete.

    /opt/vllm-venv/bin/python -m pytest --run-vllm -m vllm tests/service/test_vllm_pressure_live.py

66 blocks of 128 tokens (the fewest vLLM accepts for the model's 8,192-token context; the block size
is pinned, the backend's CPU default being 32); 16 partial
heads of 500 tokens hold 4 blocks each (64 of 66), idle between turns, so a 600-token Generate
(5 blocks) fits only if a session's blocks are freed. vLLM's own scheduler never preempts an idle
session: without the eviction the Generate waits until its deadline
(docs/vllm-bench/pressure-deadlock/). Observed through lifecycle events, not timing.
"""

from __future__ import annotations

import pytest

from protos import common_pb2, inference_pb2
from tests.service.test_vllm_policies import Calls, Timeline, head
from tests.support.inference_calls import collect

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

BLOCKS, BLOCK_SIZE, SESSIONS, HEAD = 66, 128, 16, 500


@pytest.fixture(scope="module")
def service(embedded_model_dir):
    from tests.support.inference import InferenceProcess

    running = InferenceProcess(embedded_model_dir, backend="vllm", max_streams=32, policy="fcfs",
                                   extra_args=("--kv-device-blocks", str(BLOCKS), "--block-size", str(BLOCK_SIZE),
                                               "--token-budget", "256"))
    yield running
    running.stop()


def test_a_complete_prompt_gets_the_blocks_of_an_evicted_idle_session(service):
    timeline = Timeline()
    calls = Calls(service.stub, timeline)
    names = [f"s{i}" for i in range(SESSIONS)]
    for i, name in enumerate(names):
        calls.partial(name, seed=100 + i, n=HEAD)
    for name in names:   # every head prefilled: the sessions are idle and hold 64 of the 66 blocks
        assert timeline.flag(name, "SCHEDULED").wait(600), f"{name}'s head was never prefilled"
    stats = service.stub.GetStats(inference_pb2.GetStatsRequest(), timeout=10).stats
    assert stats.pools[0].free_blocks < 5, stats.pools[0]

    calls.generate("complete", seed=999, n=600)
    assert timeline.flag("complete", "FIRST_TOKEN").wait(600), "the complete prompt never got blocks"
    evicted = [n for n in names if timeline.flag(n, "PREEMPTED_RECOMPUTE").is_set()]
    assert evicted, "no idle session was evicted"
    assert "s0" not in evicted                     # fcfs evicts the newest partial prompts first

    calls.release()                                # every session finishes; the evicted ones recompute
    for name in evicted:
        i = names.index(name)
        want = collect(service.stub.Generate(inference_pb2.GenerateRequest(
            request_id=f"ref-{name}", segments=[*head(100 + i, HEAD), common_pb2.Segment(text="\nAnswer:")],
            sampling=common_pb2.SamplingParams(max_tokens=1)), timeout=600))
        assert calls.answers[name].tokens == want.tokens, name
    service.wait_until_all_blocks_free()
