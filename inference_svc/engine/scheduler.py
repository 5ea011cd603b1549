"""The two-phase scheduler (Stream2LLM section 4.1).

Phase 1 ranks every unfinished request by the policy and decides which fit this step's
token budget and the device pool, changing nothing. Capacity counts the whole pool:
blocks held by requests that were not chosen are reclaimable by preemption.

Phase 2 acquires resources for the chosen requests in rank order: swap-in, prefix-cache
reuse, block allocation. When allocation fails it preempts not-chosen requests lowest
priority first, asking the cost model (or the fixed eviction mode) whether to recompute
or swap each one. Prefill is chunked within the budget; decodes ride in the same batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from inference_svc.engine.cost_model import CostModel
from inference_svc.engine.kv_manager import BlockPairs, KVCacheManager
from inference_svc.engine.policies import Policy, PolicyContext
from inference_svc.engine.request import Request, RequestState

EVICTION_MODES = ("recompute", "swap", "cost")


@dataclass(frozen=True)
class SchedulerConfig:
    token_budget: int = 2048
    max_running: int = 256
    eviction: str = "cost"

    def __post_init__(self) -> None:
        if self.token_budget < 1 or self.max_running < 1:
            raise ValueError("token_budget and max_running must be >= 1")
        if self.eviction not in EVICTION_MODES:
            raise ValueError(f"eviction must be one of {EVICTION_MODES}, got {self.eviction!r}")


@dataclass
class ScheduledChunk:
    request: Request
    start: int
    num_tokens: int

    @property
    def reaches_end(self) -> bool:
        return self.start + self.num_tokens == self.request.num_tokens

    @property
    def wants_logits(self) -> bool:
        """Sample after this chunk: it reaches the end of a complete prompt (or is a decode)."""
        return self.reaches_end and self.request.context_complete


@dataclass
class Preemption:
    request: Request
    kind: str            # "swap" or "recompute"
    tokens: int          # computed tokens at preemption
    blocks: int          # device blocks released


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    # ("out" | "in", pairs) in the order they were decided, to be performed in that order
    # before the forward pass: a block freed by one move may be the destination of a later one.
    block_moves: list[tuple[str, BlockPairs]] = field(default_factory=list)
    preempted: list[Preemption] = field(default_factory=list)
    swapped_in: list[Request] = field(default_factory=list)
    newly_scheduled: list[Request] = field(default_factory=list)
    prefix_hits: dict[str, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


@dataclass
class Plan:
    """Phase 1's verdict: chosen (request, tokens) in rank order, and everyone else."""

    chosen: list[tuple[Request, int]]
    not_chosen: list[Request]


class Scheduler:
    def __init__(self, config: SchedulerConfig, policy: Policy, kv: KVCacheManager, cost_model: CostModel,
                 clock: Callable[[], float]) -> None:
        self.config = config
        self.policy = policy
        self.kv = kv
        self.cost_model = cost_model
        self.clock = clock
        self.requests: dict[str, Request] = {}
        self._admissions = 0

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request

    def remove(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        self.kv.free(request.request_id)

    # --- phase 1 --------------------------------------------------------------------
    def policy_context(self, now: float) -> PolicyContext:
        """What the policy sees this step (k-LPM's cached prefixes come from the KV manager)."""
        return PolicyContext(now, self._cached_prefix_tokens, self._cached_prefix_tokens_many)

    def _cached_prefix_tokens(self, request: Request) -> int:
        return self.kv.cached_prefix_tokens(request.request_id, request.prompt_token_ids, request.output_token_ids)

    def _cached_prefix_tokens_many(self, requests: Sequence[Request]) -> list[int]:
        kv = self.kv
        if not kv.enable_prefix_cache or not kv.device.num_cached:
            return [0] * len(requests)  # nothing cached: every match is 0
        cached = kv.cached_prefix_tokens
        return [cached(r.request_id, r.prompt_token_ids, r.output_token_ids) for r in requests]

    def rank(self, now: float) -> list[Request]:
        return self.policy.order(list(self.requests.values()), self.policy_context(now))

    def plan(self, ranked: list[Request]) -> Plan:
        """Choose what runs this step. Reads state only."""
        budget, capacity = self.config.token_budget, self.kv.device.num_blocks
        max_running = self.config.max_running
        bs = self.kv.block_size
        num_cpu_blocks = self.kv.num_cpu_blocks
        chosen: list[tuple[Request, int]] = []
        not_chosen: list[Request] = []
        for position, request in enumerate(ranked):
            start = request.num_computed_tokens
            # n = min(request.num_pending_tokens, budget), footprint = max(blocks_for(start + n, bs), cpu blocks)
            n = len(request.prompt_token_ids) + len(request.output_token_ids) - start
            if n <= 0:
                not_chosen.append(request)
                continue
            if n > budget:
                n = budget
            footprint = -(-(start + n) // bs)
            cpu_blocks = num_cpu_blocks(request.request_id)
            if cpu_blocks > footprint:
                footprint = cpu_blocks
            if footprint > capacity:
                n = capacity * bs - start  # a prefill chunk may shrink to what fits
                if n <= 0 or request.is_decoding or cpu_blocks > capacity:
                    not_chosen.append(request)
                    continue
                footprint = capacity
            chosen.append((request, n))
            capacity -= footprint
            budget -= n
            if not budget or not capacity or len(chosen) >= max_running:
                # nothing further can be chosen: no tokens, no blocks or no slots left
                not_chosen += ranked[position + 1:]
                break
        return Plan(chosen, not_chosen)

    # --- phase 2 --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        ranked = self.rank(now)
        plan = self.plan(ranked)
        out = SchedulerOutput()
        victims = iter(self.policy.eviction_order(plan.not_chosen))  # consumed lowest priority first
        for request, n in plan.chosen:
            chunk = self._acquire(request, n, victims, out, now)
            if chunk is None:
                plan.not_chosen.append(request)
                continue
            out.chunks.append(chunk)
            request.passed_over_since = None
            if request.queued_since is not None:
                request.stats.time_queued_s += now - request.queued_since
                request.queued_since = None
                if request.stats.first_scheduled_time is None:
                    request.stats.first_scheduled_time = now
                out.newly_scheduled.append(request)
        finished = RequestState.FINISHED
        for request in plan.not_chosen:
            # passed over if runnable (`Request.is_runnable`, inlined: this visits every request)
            if (request.passed_over_since is None and request.state is not finished
                    and len(request.prompt_token_ids) + len(request.output_token_ids) > request.num_computed_tokens):
                request.passed_over_since = now
        return out

    def _acquire(self, request: Request, n: int, victims: Iterator[Request], out: SchedulerOutput,
                 now: float) -> ScheduledChunk | None:
        rid = request.request_id
        if request.state is RequestState.SWAPPED:
            while (pairs := self.kv.swap_in(rid)) is None:
                if not self._preempt_next(victims, out, now, protect=request):
                    return None
            out.block_moves.append(("in", pairs))
            out.swapped_in.append(request)
            self._admit(request)
        elif request.state is RequestState.WAITING or self._at_block_boundary(request):
            before = request.num_computed_tokens
            request.num_computed_tokens = self.kv.match_prefix(rid, request.prompt_token_ids, before,
                                                               request.output_token_ids)
            if request.num_computed_tokens > before:
                out.prefix_hits[rid] = request.num_computed_tokens - before
                request.stats.prefix_cache_hit_tokens += request.num_computed_tokens - before
                n = min(n, request.num_pending_tokens)
        start = request.num_computed_tokens
        while not self.kv.allocate_slots(rid, start + n):
            if self._preempt_next(victims, out, now, protect=request):
                continue
            fit = (self.kv.num_device_blocks(rid) + self.kv.device.num_free) * self.kv.block_size - start
            if fit <= 0 or request.is_decoding:
                return None
            n = fit
        if request.state is not RequestState.RUNNING:
            self._admit(request)
        return ScheduledChunk(request, start, n)

    def _at_block_boundary(self, request: Request) -> bool:
        return request.num_computed_tokens == self.kv.num_device_blocks(request.request_id) * self.kv.block_size

    def _admit(self, request: Request) -> None:
        request.state = RequestState.RUNNING
        request.admitted_seq = self._admissions
        self._admissions += 1

    def _preempt_next(self, victims: Iterator[Request], out: SchedulerOutput, now: float,
                      protect: Request) -> bool:
        """Preempt the lowest-priority not-chosen request holding device blocks. False if none."""
        for victim in victims:
            if victim is not protect and self.kv.num_device_blocks(victim.request_id) > 0:
                out.preempted.append(self.preempt(victim, now, out))
                return True
        return False

    def preempt(self, victim: Request, now: float, out: SchedulerOutput) -> Preemption:
        rid = victim.request_id
        tokens, blocks = victim.num_computed_tokens, self.kv.num_device_blocks(rid)
        mode = self.config.eviction
        swap = mode == "swap" or (mode == "cost" and not self.cost_model.prefer_recompute(tokens, blocks))
        if swap and self.kv.can_swap_out(rid):
            out.block_moves.append(("out", self.kv.swap_out(rid)))
            victim.state = RequestState.SWAPPED
            victim.stats.preemptions_swap += 1
            kind = "swap"
        else:
            self.kv.free(rid)
            victim.num_computed_tokens = 0
            victim.state = RequestState.WAITING
            victim.stats.preemptions_recompute += 1
            kind = "recompute"
        victim.preempted_at = now
        victim.queued_since = now
        return Preemption(victim, kind, tokens, blocks)
