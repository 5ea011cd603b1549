"""`GetStats` on vLLM: KV blocks and queue lengths from vLLM's scheduler stats, token counters
from its iteration stats, request counters (and the tokens updates invalidated) kept by the servicer;
turned into the message by the shared `rpc.stats` (the native engine's counters go through it too)."""

from __future__ import annotations

from inference_svc.engine.engine import EngineCounters
from inference_svc.engine.request import RequestStats
from inference_svc.rpc.stats import counters_to_proto
from inference_svc.rpc.summary import RequestSummary
from inference_svc.vllm_backend.engine import VllmCounters
from protos import inference_pb2


class StatsSource:
    def __init__(self, counters: VllmCounters, total_blocks: int, block_size: int, bytes_per_block: int,
                 model: str, policy: str, token_budget: int) -> None:
        self.counters = counters
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.model = model
        self.policy = policy
        self.token_budget = token_budget
        self.received = self.finished = self.aborted = self.tokens_invalidated = 0

    def request_received(self) -> None:
        """Once vLLM's side accepted the open (rpc.stats: a prompt refused at open is no request)."""
        self.received += 1

    def request_ended(self, summary: RequestSummary) -> None:
        self.finished += 1
        self.tokens_invalidated += summary.stats.tokens_invalidated

    def request_aborted(self, stats: RequestStats) -> None:
        self.finished += 1
        self.aborted += 1
        self.tokens_invalidated += stats.tokens_invalidated

    def snapshot(self) -> inference_pb2.EngineStats:
        c = self.counters
        with c.lock:
            used = round(c.kv_cache_usage * self.total_blocks)
            return inference_pb2.EngineStats(
                pools=[inference_pb2.BlockPoolStats(name="device", total_blocks=self.total_blocks,
                                                    free_blocks=self.total_blocks - used, block_size=self.block_size,
                                                    bytes_per_block=self.bytes_per_block),
                       inference_pb2.BlockPoolStats(name="cpu", total_blocks=0, free_blocks=0,
                                                    block_size=self.block_size, bytes_per_block=self.bytes_per_block)],
                num_running=c.num_running, num_waiting=c.num_waiting, num_swapped=0, policy=self.policy,
                token_budget=self.token_budget, model=self.model,
                counters=counters_to_proto(EngineCounters(
                    requests_received=self.received, requests_finished=self.finished,
                    requests_aborted=self.aborted, prompt_tokens_computed=c.prompt_tokens_computed,
                    generated_tokens=c.generated_tokens, tokens_invalidated=self.tokens_invalidated,
                    preemptions_recompute=c.preemptions, prefix_cache_hit_tokens=c.prefix_cache_hit_tokens,
                    steps=c.steps)))
