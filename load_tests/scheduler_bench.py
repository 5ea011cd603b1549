"""Scheduler overhead: policy ordering alone and the whole scheduling step, at N requests.

No model runs: after each step the chunks are committed as the engine would (computed
tokens advance, a decode adds a token, finished requests are replaced), so the scheduler
sees a steady mix of prefilling, decoding, idle-awaiting-input and preempted requests.
"""

from __future__ import annotations

import gc
import random
import time

from inference_svc.engine.cost_model import CostModel
from inference_svc.engine.kv_manager import KVCacheManager
from inference_svc.engine.policies import make_policy
from inference_svc.engine.request import Request
from inference_svc.engine.sampler import SamplingParams
from inference_svc.engine.scheduler import Scheduler, SchedulerConfig
from servicekit.stats import percentile


def _percentiles(samples_us: list[float]) -> dict[str, float]:
    return {"p50": percentile(samples_us, 50), "p99": percentile(samples_us, 99)}


def _new_request(rng: random.Random, index: int, now: float) -> Request:
    request = Request(f"r{index}", SamplingParams(max_tokens=4), arrival_time=now - rng.random())
    request.prompt_token_ids = [rng.randrange(1000) for _ in range(rng.randrange(64, 1024))]
    request.context_complete = rng.random() < 0.5
    request.last_chunk_arrival_time = now - rng.random()
    return request


def measure_scheduler_us(num_requests: int, policy: str = "lcas", steps: int = 300,
                         seed: int = 0) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    clock = [1000.0]
    kv = KVCacheManager(num_device_blocks=num_requests * 24, num_cpu_blocks=num_requests * 64, block_size=16)
    scheduler = Scheduler(SchedulerConfig(), make_policy(policy), kv,
                          CostModel.builtin(), lambda: clock[0])
    for i in range(num_requests):
        scheduler.add(_new_request(rng, i, clock[0]))
    next_id = num_requests
    ordering, step = [], []
    for _ in range(steps):
        clock[0] += 0.01
        requests = list(scheduler.requests.values())
        ctx = scheduler.policy_context(clock[0])  # exactly what Scheduler.rank hands the policy
        # Collect the young garbage this loop made (token lists of new and extended requests)
        # before timing: otherwise a young collection triggered inside the timed region spends
        # 0.3-5 ms traversing the benchmark's own test data. GC stays on; nothing is frozen.
        gc.collect(0)
        started = time.perf_counter()
        scheduler.policy.order(requests, ctx)
        ordering.append((time.perf_counter() - started) * 1e6)
        started = time.perf_counter()
        out = scheduler.schedule()
        step.append((time.perf_counter() - started) * 1e6)
        for chunk in out.chunks:
            request = chunk.request
            request.num_computed_tokens += chunk.num_tokens
            if chunk.wants_logits:
                request.output_token_ids.append(1)
                if len(request.output_token_ids) >= request.sampling.max_tokens:
                    scheduler.remove(request)
                    scheduler.add(_new_request(rng, next_id, clock[0]))
                    next_id += 1
        for request in rng.sample(list(scheduler.requests.values()), k=max(1, num_requests // 20)):
            if not request.context_complete:   # some streams receive a chunk or finish
                request.prompt_token_ids += [rng.randrange(1000) for _ in range(32)]
                request.last_chunk_arrival_time = clock[0]
                request.context_complete = rng.random() < 0.3
    return {"ordering": _percentiles(ordering), "step": _percentiles(step)}
