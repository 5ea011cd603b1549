"""The two-phase scheduler (Stream2LLM section 4.1).

Phase 1 ranks every unfinished request by the policy and decides which fit this step's
token budget and the device pool, changing nothing. Capacity counts the whole pool:
blocks held by requests that were not chosen are reclaimable by preemption.

Streaming never delays complete work (the same rule under every policy): prefill of a
prompt still receiving context is speculative, so phase 1 serves two tiers, each in the
policy's order. Complete prompts and decodes come first, for tokens and for blocks. The
partial tier gets what they leave, but never more than `speculative_share` of the token
budget per step for prefill that a refinement may replace (an update-mode prompt before its
final stage, session ingestion) — a prompt that becomes complete waits behind at most that
slice of it — and never more than `speculative_append_share` for append-mode prompts, whose
prefill ahead is work they need anyway. While complete work saturates the budget the partial
tier still gets `speculative_reserve_share` of it, so partial prompts progress at saturation
instead of arriving at their last chunk with everything left.
A step that prefills a complete prompt gives the partial tier only that reserve: the prompt's
first token waits for its whole step, so the step holds its tokens and little more.
Not-chosen partial requests are also the first eviction victims.

Phase 2 acquires resources for the chosen requests in rank order: swap-in, prefix-cache
reuse, block allocation. When allocation fails it preempts not-chosen requests lowest
priority first, asking the cost model (or the fixed eviction mode) whether to recompute
or swap each one. Prefill is chunked within the budget; decodes ride in the same batch.

Scheduling classes (`SchedClass`, sessions): interactive requests rank before session ingestion
whatever the policy; in a step that runs complete work (a session query, a decode), ingestion gets
only `speculative_reserve_share` of the budget, so a query's step stays short. Background work
(Flash Query evaluation) runs only on the tokens and blocks every other request leaves; not-chosen
background requests are the first eviction victims.

Then drafts (speculative decoding, speculation.py): a decode chunk grows by its request's draft
tokens, in rank order, out of the token budget the step left and the free device blocks only —
verification never displaces a prefill and never preempts anyone.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from inference_svc.engine.chunk_store import ChunkReuse
from inference_svc.engine.cost_model import CostModel
from inference_svc.engine.kv_manager import BlockPairs, KVCacheManager
from inference_svc.engine.options import (
    DEFAULT_EVICTION,
    DEFAULT_MAX_RUNNING,
    DEFAULT_SPECULATIVE_APPEND_SHARE,
    DEFAULT_SPECULATIVE_RESERVE_SHARE,
    DEFAULT_SPECULATIVE_SHARE,
    DEFAULT_TOKEN_BUDGET,
    EVICTION_CHOICES,
)
from inference_svc.engine.policies import Policy, PolicyContext
from inference_svc.engine.request import Request, RequestState, SchedClass

EVICTION_MODES = EVICTION_CHOICES


def _sched_class(request: Request) -> int:
    return request.sched_class


def _replaceable(request: Request) -> bool:
    """A partial prompt whose prefill ahead a refinement may replace: update mode before the final
    stage, or session ingestion (which a session query arriving mid-step waits behind)."""
    return request.speculative_limit is not None or request.sched_class is SchedClass.INGEST


@dataclass(frozen=True)
class SchedulerConfig:
    token_budget: int = DEFAULT_TOKEN_BUDGET
    max_running: int = DEFAULT_MAX_RUNNING
    eviction: str = DEFAULT_EVICTION
    speculative_share: float | None = DEFAULT_SPECULATIVE_SHARE   # None: one tier, the policy's order alone
    speculative_reserve_share: float = DEFAULT_SPECULATIVE_RESERVE_SHARE
    speculative_append_share: float = DEFAULT_SPECULATIVE_APPEND_SHARE
    fill_chunks_from_exact: bool = False    # exact-mode requests fill the chunk store too (options.CHUNK_STORE_FILL)

    def __post_init__(self) -> None:
        if self.token_budget < 1 or self.max_running < 1:
            raise ValueError("token_budget and max_running must be >= 1")
        if self.eviction not in EVICTION_MODES:
            raise ValueError(f"eviction must be one of {EVICTION_MODES}, got {self.eviction!r}")
        share, reserve, append = self.speculative_share, self.speculative_reserve_share, self.speculative_append_share
        if share is not None and not (0 <= reserve <= share <= 1 and reserve <= append <= 1):
            raise ValueError("need 0 <= speculative_reserve_share <= speculative_share <= 1 "
                             "and speculative_reserve_share <= speculative_append_share <= 1")

    # The shares of a step's budget: `token_budget` unless the step's is smaller (steps bounded in time).
    def speculative_tokens_of(self, budget: int) -> int | None:
        """Most tokens of replaceable partial prefill in a step of `budget` tokens (None: no tiers)."""
        if self.speculative_share is None:
            return None
        return max(1, int(budget * self.speculative_share))

    def speculative_append_tokens_of(self, budget: int) -> int:
        """Most tokens of append-mode partial prefill in a step of `budget` tokens."""
        return max(1, int(budget * self.speculative_append_share))

    def speculative_reserve_of(self, budget: int) -> int:
        """Tokens partial prompts keep while complete ones saturate a step of `budget` tokens."""
        return int(budget * self.speculative_reserve_share)

    @property
    def speculative_tokens(self) -> int | None:
        return self.speculative_tokens_of(self.token_budget)

    @property
    def speculative_append_tokens(self) -> int:
        return self.speculative_append_tokens_of(self.token_budget)

    @property
    def speculative_reserve(self) -> int:
        return self.speculative_reserve_of(self.token_budget)


class BlockMove(enum.Enum):
    """Which way a list of (source, destination) block pairs moves before the forward pass."""

    OUT = "out"          # device -> CPU (swap out)
    IN = "in"            # CPU -> device (swap in)


class PreemptionKind(enum.Enum):
    SWAP = "swap"                # KV moved to the CPU pool, brought back later
    RECOMPUTE = "recompute"      # KV dropped, prefilled again later


@dataclass
class ScheduledChunk:
    request: Request
    start: int
    num_tokens: int                  # tokens computed this step, draft tokens included
    draft: list[int] = field(default_factory=list)   # drafted tokens after the request's last one, to verify
    reuse: ChunkReuse | None = None  # blend mode: cached passages it reuses and passages it fills (chunk_store.py)

    @property
    def reaches_end(self) -> bool:
        return self.start + self.num_tokens - len(self.draft) == self.request.num_tokens

    @property
    def wants_logits(self) -> bool:
        """Sample after this chunk: it reaches the end of a complete prompt (or is a decode)."""
        return self.reaches_end and self.request.context_complete


@dataclass
class Preemption:
    request: Request
    kind: PreemptionKind
    tokens: int          # computed tokens at preemption
    blocks: int          # device blocks released


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    # (direction, pairs) in the order they were decided, to be performed in that order
    # before the forward pass: a block freed by one move may be the destination of a later one.
    block_moves: list[tuple[BlockMove, BlockPairs]] = field(default_factory=list)
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
        # The one request registry: every request from `add` until `release`, finished ones included
        # (the caller reads their stats); only unfinished ones are ranked.
        self.requests: dict[str, Request] = {}
        self._admissions = 0
        # This step's token budget: the configured one, or less when the engine bounds steps in time
        # (step_budget.py); set before `schedule`, never above `config.token_budget`.
        self.token_budget = config.token_budget

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request

    def remove(self, request: Request) -> None:
        """The request is finished: free its blocks (it stays registered until `release`)."""
        self.kv.free(request.request_id)

    def release(self, request_id: str) -> Request | None:
        """Forget a finished request; None when unknown or not finished."""
        request = self.requests.get(request_id)
        if request is None or request.state is not RequestState.FINISHED:
            return None
        return self.requests.pop(request_id)

    # --- the KV cache, for the engine (the scheduler is the KV manager's only owner) --------------
    @property
    def block_size(self) -> int:
        return self.kv.block_size

    @property
    def capacity_tokens(self) -> int:
        """Tokens the device pool holds in all."""
        return self.kv.device.num_blocks * self.kv.block_size

    def block_table(self, request: Request) -> tuple[int, ...]:
        return tuple(self.kv.device_table(request.request_id))

    def note_computed(self, request: Request) -> None:
        """A forward pass computed up to `request.num_computed_tokens`: full blocks join the prefix cache."""
        self.kv.register_computed(request.request_id, request.token_ids, request.num_computed_tokens)

    def truncate(self, request: Request, valid: int) -> BlockPairs:
        """Drop KV from token `valid` on and set the request's computed count; returns the block
        copies the runner must make first (a shared partly valid block is copied, not written)."""
        copies = self.kv.truncate(request.request_id, valid)
        request.num_computed_tokens = self.kv.valid_tokens_after_truncate(request.request_id, valid)
        return copies

    def import_blocks(self, request: Request, start: int, end: int) -> list[int] | None:
        """A request whose prefill is filled from a transfer (disaggregated prefill, kv_export.py):
        give it device blocks for tokens [`start`, `end`) and count them computed. Returns the
        blocks to write, from block `start // block_size` on; None when it cannot take them (its KV
        does not reach `start`: swapped or recomputing; or no free block), and the engine then
        computes those tokens itself. Never preempts anyone."""
        rid = request.request_id
        if (request.state is RequestState.SWAPPED or request.num_computed_tokens < start
                or request.num_computed_tokens >= end or start % self.kv.block_size):
            return None
        if not self.kv.allocate_slots(rid, end):
            return None
        if request.state is not RequestState.RUNNING:
            self._admit(request)
        request.num_computed_tokens = end
        self.note_computed(request)
        bs = self.kv.block_size
        return self.kv.device_table(rid)[start // bs:-(-end // bs)]

    def pools(self):
        """The device and CPU block pools, read-only, for stats."""
        return self.kv.device, self.kv.cpu

    @property
    def chunk_captures_skipped(self) -> int:
        """Blend captures the chunk store skipped for lack of free blocks (chunk_store.py), for stats."""
        return self.kv.chunks.stats.captures_skipped

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
        finished = RequestState.FINISHED
        ranked = self.policy.order([r for r in self.requests.values() if r.state is not finished],
                                   self.policy_context(now))
        if any(r.sched_class for r in ranked):      # sessions: a stable partition by class
            ranked.sort(key=_sched_class)
        return ranked

    def plan(self, ranked: list[Request]) -> Plan:
        """Choose what runs this step. Reads state only."""
        budget, capacity = self.token_budget, self.kv.device.num_blocks
        config = self.config
        chosen: list[tuple[Request, int]] = []
        not_chosen: list[Request] = []
        if ranked and ranked[-1].sched_class is SchedClass.BACKGROUND:   # rank() put them last
            split = next(i for i, r in enumerate(ranked) if r.sched_class is SchedClass.BACKGROUND)
            foreground = self.plan(ranked[:split])
            budget -= sum(n for _, n in foreground.chosen)
            capacity -= self._footprint(foreground.chosen)
            self._fill(ranked[split:], budget, capacity, foreground.chosen, foreground.not_chosen)
            return foreground
        cap = config.speculative_tokens_of(budget)
        if cap is None:
            self._fill(ranked, budget, capacity, chosen, not_chosen)
            return Plan(chosen, not_chosen)
        complete = [r for r in ranked if r.context_complete]
        if len(complete) == len(ranked):
            self._fill(ranked, budget, capacity, chosen, not_chosen)
            return Plan(chosen, not_chosen)
        partial = [r for r in ranked if not r.context_complete] if complete else ranked
        reserve = config.speculative_reserve_of(budget)
        reserved = min(reserve, cap, sum(max(r.num_schedulable_tokens, 0) for r in partial))
        budget_left, capacity = self._fill(complete, budget - reserved, capacity, chosen, not_chosen)
        partial_budget = min(max(cap, config.speculative_append_tokens_of(budget)), budget_left + reserved)
        if any(not r.is_decoding for r, _ in chosen):
            # A complete prompt prefills this step, and its first token waits for the whole step:
            # the partial tier gets only the reserve, so the step is its tokens and little more.
            partial_budget = min(partial_budget, reserved)
        if chosen and partial[-1].sched_class is SchedClass.INGEST:
            # Complete work runs this step: session ingestion gets only the reserve, so the step that
            # carries a session query (or a decode) stays short; ingestion still progresses.
            split = next(i for i, r in enumerate(partial) if r.sched_class is SchedClass.INGEST)
            partial_budget, capacity = self._fill(partial[:split], partial_budget, capacity, chosen, not_chosen,
                                                  replaceable_budget=cap)
            self._fill(partial[split:], min(partial_budget, reserve), capacity, chosen,
                       not_chosen)
            return Plan(chosen, not_chosen)
        self._fill(partial, partial_budget, capacity, chosen, not_chosen, replaceable_budget=cap)
        return Plan(chosen, not_chosen)

    def _footprint(self, chosen: list[tuple[Request, int]]) -> int:
        """Device blocks the chosen requests occupy after their chunks (as `_fill` counts them)."""
        bs, cpu = self.kv.block_size, self.kv.num_cpu_blocks
        return sum(max(-(-(r.num_computed_tokens + n) // bs), cpu(r.request_id)) for r, n in chosen)

    def _fill(self, ranked: list[Request], budget: int, capacity: int, chosen: list[tuple[Request, int]],
              not_chosen: list[Request], replaceable_budget: int | None = None) -> tuple[int, int]:
        """Phase 1 over one tier: choose in rank order what fits `budget` tokens and `capacity` blocks
        (and the running cap); returns the (budget, capacity) left. With `replaceable_budget`, the
        partial prompts whose prefill a refinement may replace (`_replaceable`) share at most that many."""
        max_running = self.config.max_running
        bs = self.kv.block_size
        num_cpu_blocks = self.kv.num_cpu_blocks
        for position, request in enumerate(ranked):
            if budget <= 0 or capacity <= 0 or len(chosen) >= max_running:
                # nothing further can be chosen: no tokens, no blocks or no slots left
                not_chosen += ranked[position:]
                break
            start = request.num_computed_tokens
            # n = min(request.num_schedulable_tokens, budget), footprint = max(blocks_for(start + n, bs), cpu blocks)
            n = len(request.prompt_token_ids) + len(request.output_token_ids) - start
            if request.speculative_limit is not None and not request.context_complete:
                n = min(n, request.speculative_limit - start)
            if n <= 0:
                not_chosen.append(request)
                continue
            if n > budget:
                n = budget
            replaceable = replaceable_budget is not None and _replaceable(request)
            if replaceable and n > replaceable_budget:
                n = replaceable_budget
                if n <= 0:
                    not_chosen.append(request)
                    continue
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
            if replaceable:
                replaceable_budget -= n
        return budget, capacity

    # --- phase 2 --------------------------------------------------------------------
    def schedule(self, drafts: dict[str, list[int]] | None = None) -> SchedulerOutput:
        """One step's work. `drafts`: tokens to verify after a decoding request's last token, by id."""
        now = self.clock()
        self.kv.begin_step()
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
            self.policy.charge(request, chunk.num_tokens)   # fair share: as it is computed (fair_share.py)
            request.passed_over_since = None
            if request.queued_since is not None:
                request.stats.time_queued_s += now - request.queued_since
                request.queued_since = None
                if request.stats.first_scheduled_time is None:
                    request.stats.first_scheduled_time = now
                out.newly_scheduled.append(request)
        for chunk in out.chunks:     # the chunk store, once every chosen request holds its blocks
            if chunk.request.stats.kv_reuse == "blend":
                self._plan_reuse(chunk, out, reuse=True)
            elif self.config.fill_chunks_from_exact and chunk.request.context_spans:
                self._plan_reuse(chunk, out, reuse=False)
        finished = RequestState.FINISHED
        for request in plan.not_chosen:
            # passed over if runnable (`Request.is_runnable`, inlined: this visits every request)
            if request.passed_over_since is None and request.state is not finished and request.is_runnable:
                request.passed_over_since = now
        if drafts:
            self._add_drafts(out, drafts)
        return out

    def _add_drafts(self, out: SchedulerOutput, drafts: dict[str, list[int]]) -> None:
        """Grow one-token decode chunks by their drafts, within the budget left and free blocks."""
        budget = self.token_budget - out.num_tokens
        bs = self.kv.block_size
        for chunk in out.chunks:
            if budget <= 0:
                return
            draft = drafts.get(chunk.request.request_id)
            if not draft or chunk.num_tokens != 1 or not chunk.wants_logits:
                continue
            rid = chunk.request.request_id
            end = chunk.start + 1
            fits = (self.kv.num_device_blocks(rid) + self.kv.device.num_free) * bs - end
            n = min(len(draft), budget, fits)
            if n <= 0 or not self.kv.allocate_slots(rid, end + n):
                continue
            chunk.draft = list(draft[:n])
            chunk.num_tokens += n
            budget -= n

    def fork(self, child: Request, parent: Request, num_tokens: int) -> BlockPairs:
        """Start `child` (new, holding nothing) on the parent's device KV of its first `num_tokens`
        tokens, which the two share (sessions). Returns block copies the runner must make first.
        A parent without device KV (swapped or waiting) gives nothing: the child computes it all."""
        if parent.state is not RequestState.RUNNING:
            return []
        shared, copies = self.kv.fork(parent.request_id, child.request_id,
                                      min(num_tokens, parent.num_computed_tokens))
        if shared:
            child.num_computed_tokens = shared
            self._admit(child)
        return copies

    def _plan_reuse(self, chunk: ScheduledChunk, out: SchedulerOutput, reuse: bool) -> None:
        """Blend mode (`reuse`): cached passages this chunk reuses and the passages it fills; exact mode
        (the store filled from every request): only the passages it fills, its own KV untouched."""
        request = chunk.request
        plan = self.kv.plan_reuse(request.request_id, request.prompt_token_ids, request.context_spans, chunk.start,
                                  chunk.num_tokens, request.blend_recompute, reuse=reuse)
        if plan.moves:
            out.block_moves.append((BlockMove.OUT, plan.moves))
        chunk.reuse = plan.reuse
        request.stats.note_reuse(plan)

    def _reclaim(self, out: SchedulerOutput, num_blocks: int) -> bool:
        """Evict cached chunks (chunk_store.py) until `num_blocks` device blocks are free; False if none."""
        moves = self.kv.reclaim_chunks(num_blocks)
        if moves:
            out.block_moves.append((BlockMove.OUT, moves))
        return moves is not None

    def rollback(self, request: Request, valid: int) -> BlockPairs:
        """After verification: keep KV of the first `valid` tokens, free blocks past them."""
        return self.truncate(request, valid)

    def _acquire(self, request: Request, n: int, victims: Iterator[Request], out: SchedulerOutput,
                 now: float) -> ScheduledChunk | None:
        rid = request.request_id
        if request.state is RequestState.SWAPPED:
            while (pairs := self.kv.swap_in(rid)) is None:
                if not (self._reclaim(out, self.kv.num_cpu_blocks(rid))
                        or self._preempt_next(victims, out, now, protect=request)):
                    return None
            out.block_moves.append((BlockMove.IN, pairs))
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
            if (self._reclaim(out, self.kv.blocks_needed(rid, start + n))
                    or self._preempt_next(victims, out, now, protect=request)):
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
        swap = mode == "swap" or (mode == "cost" and not self.cost_model.prefer_recompute(
            tokens, blocks, victim.expected_keep_fraction))
        if swap and self.kv.can_swap_out(rid):
            out.block_moves.append((BlockMove.OUT, self.kv.swap_out(rid)))
            victim.state = RequestState.SWAPPED
            victim.stats.preemptions_swap += 1
            kind = PreemptionKind.SWAP
        else:
            self.kv.free(rid)
            victim.num_computed_tokens = 0
            victim.state = RequestState.WAITING
            victim.stats.preemptions_recompute += 1
            kind = PreemptionKind.RECOMPUTE
        victim.preempted_at = now
        victim.queued_since = now
        return Preemption(victim, kind, tokens, blocks)
