"""The engine on a CUDA device (marker `cuda`, `--run-cuda`; `scripts/gpu_check.sh` runs these).

Random weights of the 135M shape (no weights travel to the GPU machine), fp32 where tokens must be
equal: greedy output through the Engine under appends, an update and preemption equals one-shot
Generate; a CUDA graph's replay equals the eager forward; a step at a context length never seen
before replays the same graph and compiles nothing; swap goes through pinned host memory.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda

SHAPE = "smollm2-135m"


@pytest.fixture(scope="module")
def config():
    from inference_svc.engine.models import random_llama_config

    return random_llama_config(SHAPE)


def _runner(config, *, graphs: bool, dtype=torch.float32, blocks: int = 128, cpu_blocks: int = 16):
    from inference_svc.engine.model_runner import ModelRunner

    return ModelRunner(config, device="cuda", dtype=dtype, block_size=16, num_device_blocks=blocks,
                       num_cpu_blocks=cpu_blocks, seed=0, cuda_graphs=graphs)


def test_greedy_streams_equal_generate_under_appends_update_and_preemption(config):
    from load_tests.gpu_measures import EngineSetup, exactness

    result = exactness(EngineSetup(config, torch.device("cuda"), torch.float32, "triton"), doc_tokens=120)
    assert result["appends"] and result["update"], result
    assert result["recompute"] and result["swap"], result
    assert result["max_logit_diff"] <= 1e-3, result


def test_runner_uses_the_kernels_and_graphs_on_cuda(config):
    runner = _runner(config, graphs=True)
    assert runner.attention == "triton"
    assert runner._graphs is not None and runner._graphs.max_batch >= 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager(config, dtype):
    from inference_svc.engine.model_runner import ChunkInput

    graphs, eager = _runner(config, graphs=True, dtype=dtype), _runner(config, graphs=False, dtype=dtype)
    prompts = [list(range(5 + i, 40 + 3 * i)) for i in range(3)]
    tables = [list(range(8 * i, 8 * i + 8)) for i in range(3)]
    for runner in (graphs, eager):
        runner.execute([ChunkInput(p, 0, t, False) for p, t in zip(prompts, tables, strict=True)])
    decodes = [ChunkInput([7 + i], len(p), t, True) for i, (p, t) in enumerate(zip(prompts, tables, strict=True))]
    before = graphs.graph_replays
    a, b = graphs.execute(decodes), eager.execute(decodes)
    assert graphs.graph_replays == before + 1 and eager.graph_replays == 0
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(a, b, atol=tolerance, rtol=tolerance)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_a_new_context_length_compiles_nothing_and_replays_the_graph(config):
    from inference_svc.engine import triton_attention
    from inference_svc.engine.device_calls import count_device_calls
    from inference_svc.engine.model_runner import ChunkInput

    runner = _runner(config, graphs=True, dtype=torch.bfloat16)
    table = list(range(16))
    runner.execute([ChunkInput(list(range(3, 100)), 0, table, True)])
    runner.execute([ChunkInput([5], 97, table, True)])     # the decode variant compiled (at capture already)
    kernels = triton_attention.compiled_variants()
    counts = []
    for position in (98, 99, 150, 201):                    # lengths never seen before
        _, calls = count_device_calls(lambda p=position: runner.execute([ChunkInput([5], p, table, True)]),
                                      runner.device)
        counts.append(calls.launches)
    assert triton_attention.compiled_variants() == kernels
    if None in counts:
        pytest.skip("the profiler sees no CUDA calls on this machine: launches cannot be counted")
    assert len(set(counts)) == 1 and counts[0] <= 4, counts   # the batch copy and one graph launch, not a forward


def test_swap_goes_through_pinned_memory_and_round_trips(config):
    runner = _runner(config, graphs=False, dtype=torch.bfloat16, blocks=8, cpu_blocks=8)
    cache = runner.kv_cache
    assert cache.cpu_pool.is_pinned()
    cache.device_pool[:, :, 2].normal_()
    original = cache.device_pool[:, :, 2].clone()
    runner.swap_out([(2, 5)])
    cache.device_pool[:, :, 2].zero_()
    runner.swap_in([(5, 6)])
    torch.cuda.synchronize()
    assert torch.equal(cache.device_pool[:, :, 6], original)
