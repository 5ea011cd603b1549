"""Start vLLM's AsyncLLM for a `VllmSpec`, with a stat logger that keeps vLLM's own metrics.

Imports vllm at module level: only `service.py` imports this module, and only for `--backend vllm`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from inference_svc.vllm_backend.config import VllmSpec, engine_args, prepare_environment

log = logging.getLogger(__name__)


@dataclass
class VllmCounters:
    """vLLM's scheduler and iteration stats, accumulated since the engine started."""

    steps: int = 0
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prompt_tokens_computed: int = 0
    prefix_cache_hit_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class CountersLogger(StatLoggerBase):
    """A vLLM stat logger (called by AsyncLLM's output handler after every engine step)."""

    counters: VllmCounters   # set on the class by `make_logger_factory`

    def __init__(self, vllm_config, engine_index: int = 0) -> None:
        self.engine_index = engine_index

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        c = self.counters
        with c.lock:
            if scheduler_stats is not None:
                c.steps += 1
                c.num_running = scheduler_stats.num_running_reqs
                c.num_waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                c.kv_cache_usage = scheduler_stats.kv_cache_usage
            if iteration_stats is not None:
                c.prompt_tokens_computed += iteration_stats.prompt_token_stats.computed
                c.prefix_cache_hit_tokens += iteration_stats.prompt_token_stats.local_cache_hit
                c.generated_tokens += iteration_stats.num_generation_tokens
                c.preemptions += iteration_stats.num_preempted_reqs

    def log_engine_initialized(self) -> None:
        pass


def start_engine(spec: VllmSpec, kv_spool: str | None = None) -> tuple[AsyncLLM, VllmCounters]:
    """Create the engine (spawns vLLM's engine core process). Call before the gRPC server starts.
    `kv_spool`: run our KV connector through that directory (disaggregated prefill and decode)."""
    prepare_environment(spec)
    counters = VllmCounters()
    logger_cls = type("StreamragCountersLogger", (CountersLogger,), {"counters": counters})
    args: AsyncEngineArgs = engine_args(spec, kv_spool)
    vllm_config = args.create_engine_config()
    scheduler = vllm_config.scheduler_config
    if scheduler.scheduler_cls is not None and not scheduler.async_scheduling:
        # vLLM turned async scheduling off here: our policy on its synchronous scheduler
        scheduler.scheduler_cls = "inference_svc.vllm_backend.scheduler.PolicyStreamingSyncScheduler"
    llm = AsyncLLM.from_vllm_config(vllm_config, stat_loggers=[logger_cls])
    return llm, counters
