"""The streaming engine: requests in, events out, one `step()` at a time.

    engine = Engine(runner, tokenizer, EngineConfig(policy="lcas"))
    engine.open("q1", [Segment(text=instructions)], SamplingParams(max_tokens=64))
    engine.append("q1", [Segment(text=doc, key="doc-7")])   # prefilled as it arrives
    engine.update("q1", [...])                                # KV kept up to the token LCP
    engine.finish("q1", [Segment(text=suffix)])                # decoding may start
    while engine.has_unfinished():
        for event in engine.step(): ...

The engine is single-threaded: callers serialize `open/append/update/finish/abort/step`
(the gRPC service owns a thread that does). Errors in caller input raise `EngineInputError`
subclasses and change nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from inference_svc.engine.chunk_store import keyed_spans
from inference_svc.engine.cost_model import CostModel
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.fair_share import NO_SHARE, Share
from inference_svc.engine.kv_manager import KVCacheManager
from inference_svc.engine.model_runner import ChunkInput
from inference_svc.engine.options import (
    CHUNK_STORE_FILL_CHOICES,
    DEFAULT_BLEND_RECOMPUTE,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_STORE_FILL,
    DEFAULT_DRAFT_BUDGET,
    DEFAULT_EVICTION,
    DEFAULT_KV_REUSE,
    DEFAULT_MAX_RUNNING,
    DEFAULT_POLICY,
    DEFAULT_SPECULATIVE_APPEND_SHARE,
    DEFAULT_SPECULATIVE_RESERVE_SHARE,
    DEFAULT_SPECULATIVE_SHARE,
    DEFAULT_TOKEN_BUDGET,
)
from inference_svc.engine.output_text import OutputText, finish_reason
from inference_svc.engine.policies import make_policy
from inference_svc.engine.request import FinishReason, Request, RequestState, SchedClass, Segment
from inference_svc.engine.sampler import RequestSampler, SamplingParams
from inference_svc.engine.scheduler import PreemptionKind, Scheduler, SchedulerConfig, SchedulerOutput
from inference_svc.engine.speculation import DEFAULT_NGRAM_SIZES, DepthSettings, GateSettings, Speculation
from inference_svc.engine.step_budget import StepBudget
from inference_svc.engine.step_log import StepLog
from inference_svc.engine.step_timing import StepStats, StepTiming
from inference_svc.engine.tokenization import SegmentTokenizer


class EngineInputError(ValueError):
    """The caller asked for something invalid; nothing changed."""


class UnknownRequestError(EngineInputError):
    pass


class DuplicateRequestError(EngineInputError):
    pass


class PromptTooLongError(EngineInputError):
    pass


class Runner(Protocol):
    """What the engine needs from a model runner (the real one, or a fake in scheduler tests)."""

    eos_token_ids: Sequence[int]
    config: Any          # needs .max_position_embeddings and .vocab_size

    @property
    def synchronous(self) -> bool:
        """True when `execute`'s results are ready without waiting for a device (a CPU): a forward's
        time is known as soon as it returns."""
        ...

    def execute(self, chunks: list[ChunkInput]) -> torch.Tensor: ...
    def swap_out(self, pairs: list[tuple[int, int]]) -> None: ...
    def swap_in(self, pairs: list[tuple[int, int]]) -> None: ...
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None: ...


@dataclass(frozen=True)
class EngineConfig:
    num_device_blocks: int = 1024
    num_cpu_blocks: int = 1024
    block_size: int = DEFAULT_BLOCK_SIZE
    token_budget: int = DEFAULT_TOKEN_BUDGET          # the most tokens a step computes
    # Steps bounded in time (step_budget.py): each step's budget is what fits this many ms, capped by
    # token_budget; None: every step gets token_budget. The service's default is DEFAULT_STEP_TIME_TARGET_MS.
    step_time_target_ms: float | None = None
    max_running: int = DEFAULT_MAX_RUNNING
    policy: str = DEFAULT_POLICY
    policy_options: dict = field(default_factory=dict)
    eviction: str = DEFAULT_EVICTION
    speculative_share: float | None = DEFAULT_SPECULATIVE_SHARE   # see scheduler.py: None turns the tiers off
    speculative_reserve_share: float = DEFAULT_SPECULATIVE_RESERVE_SHARE
    speculative_append_share: float = DEFAULT_SPECULATIVE_APPEND_SHARE
    enable_prefix_cache: bool = True
    max_model_len: int | None = None   # default: the model's max positions
    # speculative decoding (speculation/): draft tokens per step that auto-depth requests share,
    # the n-gram sizes drafts are looked up with, the auto depth's settings, and the gate that caps
    # auto depths where measured drafts do not pay (None: uncapped)
    draft_budget: int = DEFAULT_DRAFT_BUDGET
    draft_ngram_sizes: tuple[int, ...] = DEFAULT_NGRAM_SIZES
    depth_settings: DepthSettings = field(default_factory=DepthSettings)
    speculation_gate: GateSettings | None = field(default_factory=GateSettings)
    # KV reuse (chunk_store.py): a request's mode when it names none, the blend's recompute share when it
    # names none, and the chunk store's most device blocks (None: a quarter of the pool)
    kv_reuse: str = DEFAULT_KV_REUSE
    blend_recompute: float = DEFAULT_BLEND_RECOMPUTE
    chunk_device_blocks: int | None = None
    chunk_store_fill: str = DEFAULT_CHUNK_STORE_FILL   # options.CHUNK_STORE_FILL_CHOICES
    # measure each step's kernel launches and host syncs into StepStats (device_calls.py; slow: benchmarks)
    count_device_calls: bool = False

    def __post_init__(self) -> None:
        if self.chunk_store_fill not in CHUNK_STORE_FILL_CHOICES:
            raise ValueError(f"chunk_store_fill must be one of {', '.join(CHUNK_STORE_FILL_CHOICES)}, "
                             f"got {self.chunk_store_fill!r}")

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(self.token_budget, self.max_running, self.eviction, self.speculative_share,
                               self.speculative_reserve_share, self.speculative_append_share,
                               fill_chunks_from_exact=self.chunk_store_fill == "all")

    def kv_manager(self) -> KVCacheManager:
        return KVCacheManager(self.num_device_blocks, self.num_cpu_blocks, self.block_size, self.enable_prefix_cache,
                              self.chunk_device_blocks, spill_chunks=self.eviction != "recompute")


@dataclass
class EngineCounters:
    requests_received: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0
    tokens_invalidated: int = 0
    preemptions_swap: int = 0
    preemptions_recompute: int = 0
    prefix_cache_hit_tokens: int = 0
    steps: int = 0
    draft_tokens: int = 0               # drafted tokens verified
    accepted_draft_tokens: int = 0      # drafted tokens accepted (emitted)
    chunk_captures_skipped: int = 0     # blend captures the chunk store had no free blocks for (chunk_store.py)


class Engine:
    def __init__(self, runner: Runner, tokenizer: SegmentTokenizer, config: EngineConfig = EngineConfig(),
                 cost_model: CostModel | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config
        self.clock = clock
        model_len = runner.config.max_position_embeddings
        self.max_model_len = min(config.max_model_len or model_len, model_len)
        self.cost_model = cost_model or CostModel.builtin()
        self.policy = make_policy(config.policy, **config.policy_options)
        self.scheduler = Scheduler(config.scheduler_config(), self.policy, config.kv_manager(), self.cost_model, clock)
        target_ms = config.step_time_target_ms
        self.step_budget = (None if target_ms is None else
                            StepBudget.from_cost_model(self.cost_model, target_ms, config.token_budget))
        self.step_log = StepLog.from_env()  # STREAMRAG_STEP_LOG: one line per step (step_log.py)
        self.timing = StepTiming(self.cost_model, self.step_budget, self.step_log, runner.synchronous,
                                 config.count_device_calls)
        self.sampler = RequestSampler()
        self.counters = EngineCounters()
        self.speculation = Speculation(self.counters, config.draft_budget, config.depth_settings,
                                       config.draft_ngram_sizes, config.speculation_gate)
        self.requests = self.scheduler.requests     # the one registry, owned by the scheduler
        self._outputs: dict[str, OutputText] = {}
        self._events: list[EngineEvent] = []
        self.last_step = StepStats()

    # --- caller input ---------------------------------------------------------------
    def open(self, request_id: str, segments: Sequence[Segment], sampling: SamplingParams,
             priority: int = 0, arrived_at: float | None = None,
             sched_class: SchedClass = SchedClass.INTERACTIVE, share: Share = NO_SHARE) -> Request:
        """A new request (`share`: the tenant it is served for, ranked and charged by fair share)."""
        if not request_id:
            raise EngineInputError("request id must not be empty")
        if request_id in self.requests:
            raise DuplicateRequestError(f"request {request_id!r} already exists")
        try:
            sampling.validate()
        except ValueError as exc:
            raise EngineInputError(str(exc)) from exc
        now = self.clock() if arrived_at is None else arrived_at
        request = Request(request_id, sampling, now, priority, sched_class, tenant=share.tenant,
                          tenant_weight=share.weight, head_segments=list(segments))
        request.stats.kv_reuse = sampling.kv_reuse or self.config.kv_reuse
        request.blend_recompute = (self.config.blend_recompute if sampling.blend_recompute is None
                                   else sampling.blend_recompute)
        self._set_prompt(request, self._encode(segments))
        request.num_head_tokens = request.num_prompt_tokens
        self.scheduler.add(request)
        self._outputs[request_id] = OutputText(self.tokenizer.decode, sampling.stop)
        self.speculation.add(request_id, sampling)
        self.counters.requests_received += 1
        self._emit(request, EventKind.QUEUED)
        return request

    def fork(self, request_id: str, parent_id: str, num_tokens: int, suffix: Sequence[Segment],
             sampling: SamplingParams, sched_class: SchedClass = SchedClass.INTERACTIVE,
             track_confidence: bool = False, share: Share = NO_SHARE, priority: int = 0) -> Request:
        """A complete request whose prompt is the parent's first `num_tokens` prompt tokens and then
        `suffix`, sharing the parent's KV of those tokens copy-on-write (a session query: it computes
        only what the parent has not). Decoding starts as soon as it is scheduled. `share` and `priority`:
        as for `open` (a fork's own, not its parent's)."""
        parent = self.requests.get(parent_id)
        if parent is None or parent.is_finished:
            raise UnknownRequestError(f"fork: no request {parent_id!r}")
        if not 0 <= num_tokens <= parent.num_prompt_tokens:
            raise EngineInputError(f"fork: {num_tokens} tokens is outside the parent's prompt")
        request = self.open(request_id, (), sampling, priority, sched_class=sched_class, share=share)
        request.track_confidence = track_confidence
        try:
            head = parent.prompt_token_ids[:num_tokens]
            self.finish(request_id, [*([Segment(token_ids=tuple(head))] if head else []), *suffix])
        except Exception:
            self.abort(request_id)
            self.release(request_id)
            raise
        copies = self.scheduler.fork(request, parent, num_tokens)
        if copies:
            self.runner.copy_blocks(copies)
        return request

    def append(self, request_id: str, segments: Sequence[Segment], arrived_at: float | None = None) -> None:
        """Add segments at the end of the context (the computed KV stays valid)."""
        request = self._open_request(request_id, "append")
        spans = keyed_spans(self.tokenizer.encode, segments, request.num_prompt_tokens)
        self._set_prompt(request, request.prompt_token_ids + self._encode(segments))
        request.context_segments.extend(segments)
        request.context_spans += spans
        request.stats.num_appends += 1
        request.note_input(self.clock() if arrived_at is None else arrived_at)

    def update(self, request_id: str, segments: Sequence[Segment], arrived_at: float | None = None,
               final: bool = True) -> None:
        """Replace the context (not the head); keep KV up to the token LCP. Unless this is the
        final refinement, prefill ahead only the leading segments likely to survive the next one."""
        request = self._open_request(request_id, "update")
        new_tokens = request.prompt_token_ids[:request.num_head_tokens] + self._encode(segments)
        self._check_fits(request, new_tokens)
        request.speculative_limit = (None if final else
                                     request.num_head_tokens + self.tokenizer.stable_prefix_tokens(segments))
        lcp = lcp_length(request.prompt_token_ids, new_tokens)
        valid = min(lcp, request.num_computed_tokens)
        invalidated = request.num_computed_tokens - valid
        request.prompt_token_ids = new_tokens
        request.context_segments = list(segments)
        request.context_spans = keyed_spans(self.tokenizer.encode, segments, request.num_head_tokens)
        invalidated += valid - self._invalidate_from(request, valid)
        if invalidated:
            request.stats.tokens_invalidated += invalidated
            self.counters.tokens_invalidated += invalidated
            self._emit(request, EventKind.INVALIDATED, count=invalidated)
        request.stats.num_updates += 1
        request.note_input(self.clock() if arrived_at is None else arrived_at)

    def finish(self, request_id: str, suffix: Sequence[Segment] = (), arrived_at: float | None = None) -> None:
        """No more input: append the suffix and let the request decode."""
        request = self._open_request(request_id, "finish")
        tokens = request.prompt_token_ids + self._encode(suffix)
        if not tokens:
            raise EngineInputError("the prompt is empty")
        self._set_prompt(request, tokens)
        request.suffix_segments = list(suffix)
        request.context_complete = True
        if request.num_pending_tokens == 0:
            # Everything is prefilled but the last chunk produced no logits (the context was not
            # complete then): recompute the last token. Truncating copies a shared block first.
            self._invalidate_from(request, request.num_computed_tokens - 1)
        request.note_input(self.clock() if arrived_at is None else arrived_at)

    def abort(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return
        self.counters.requests_aborted += 1
        self._finish(request, FinishReason.ABORT)

    # --- stepping -------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return any(not r.is_finished for r in self.requests.values())

    def has_work(self) -> bool:
        return bool(self._events) or any(r.is_runnable for r in self.requests.values())

    def take_events(self) -> list[EngineEvent]:
        """Events raised by caller input (QUEUED, INVALIDATED, FINISHED on abort) since the last call."""
        events, self._events = self._events, []
        return events

    def step(self) -> list[EngineEvent]:
        """Schedule, move KV, run one forward pass, sample; returns the events since the last step."""
        self.timing.begin()
        if self.step_budget is not None:
            self.scheduler.token_budget = self.step_budget.budget(self.requests.values())
        out = self.scheduler.schedule(self.speculation.propose(self.requests, self.max_sequence_tokens,
                                                               self.last_step, self.scheduler.token_budget))
        self._note_scheduling(out)
        if out.block_moves:
            self.timing.move_blocks(out.block_moves, self.runner.swap_out, self.runner.swap_in)
        emitted = self.timing.run(out, lambda: self._run(out))
        self.last_step = self.timing.end(out, emitted, self.scheduler.token_budget, self.requests.values(),
                                         lambda: self.scheduler.pools()[0].num_free)
        self.speculation.observe(self.last_step)
        self.counters.steps += 1
        events, self._events = self._events, []
        return events

    def _run(self, out: SchedulerOutput) -> int:
        """Run the step's chunks and take their tokens; returns how many tokens it emitted."""
        inputs = []
        for chunk in out.chunks:
            request = chunk.request
            tokens = request.token_ids[chunk.start:chunk.start + chunk.num_tokens - len(chunk.draft)] + chunk.draft
            inputs.append(ChunkInput(tokens, chunk.start, self.scheduler.block_table(request), chunk.wants_logits,
                                     1 + len(chunk.draft), chunk.reuse))
        self.timing.forward_started(out)
        logits = self.runner.execute(inputs)
        self.timing.forward_done(tokens_read=False)
        emitted = self.speculation.take_tokens(out.chunks, logits, self.sampler.sample)
        self.timing.forward_done(tokens_read=bool(emitted))
        for chunk in out.chunks:
            request = chunk.request
            computed = chunk.num_tokens - len(chunk.draft)
            if chunk.draft:
                computed += len(emitted[id(chunk)]) - 1      # the accepted drafts' KV stays
            request.num_computed_tokens += computed
            request.stats.tokens_computed += computed
            if not request.is_decoding:
                self.counters.prompt_tokens_computed += computed
            if chunk.draft:
                copies = self.scheduler.rollback(request, request.num_computed_tokens)
                if copies:
                    self.runner.copy_blocks(copies)
            else:
                self.scheduler.note_computed(request)
            if not chunk.wants_logits and request.num_pending_tokens == 0:
                self._emit(request, EventKind.KV_ON_GPU, count=request.num_computed_tokens)
        for chunk in out.chunks:
            for token in emitted.get(id(chunk), ()):
                if chunk.request.is_finished:
                    break
                self._accept_token(chunk.request, token)
            if chunk.draft and not chunk.request.is_finished:
                self.scheduler.note_computed(chunk.request)   # now that the accepted tokens are its tokens
        return sum(len(tokens) for tokens in emitted.values())

    def _accept_token(self, request: Request, token: int) -> None:
        first = not request.output_token_ids
        if first:
            self._emit(request, EventKind.KV_ON_GPU, count=request.num_computed_tokens)
        request.output_token_ids.append(token)
        self.counters.generated_tokens += 1
        now = self.clock()
        if first:
            request.stats.first_token_time = now
            self._emit(request, EventKind.FIRST_TOKEN)
        output = self._outputs[request.request_id]
        reason = finish_reason(output, request.output_token_ids, request.sampling, self.runner.eos_token_ids,
                               room_to_grow=request.num_tokens + 1 <= self.max_sequence_tokens)
        self._emit(request, EventKind.TOKEN, token_id=token, text=output.take(final=reason is not None))
        if reason is not None:
            self._finish(request, reason)

    @property
    def max_sequence_tokens(self) -> int:
        """The longest sequence (prompt + output) this engine can hold: model context or device pool."""
        return min(self.max_model_len, self.scheduler.capacity_tokens)

    def _note_scheduling(self, out: SchedulerOutput) -> None:
        for request in out.newly_scheduled:
            self._emit(request, EventKind.SCHEDULED)
        for request in out.swapped_in:
            self._emit(request, EventKind.KV_ON_GPU, count=request.num_computed_tokens, detail="swapped in")
        self.counters.prefix_cache_hit_tokens += sum(out.prefix_hits.values())
        self.counters.chunk_captures_skipped = self.scheduler.chunk_captures_skipped
        for p in out.preempted:
            swapped = p.kind is PreemptionKind.SWAP
            self.counters.preemptions_swap += swapped
            self.counters.preemptions_recompute += not swapped
            self._emit(p.request, EventKind.PREEMPTED_SWAP if swapped else EventKind.PREEMPTED_RECOMPUTE,
                       count=p.tokens, detail=f"{p.blocks} blocks")

    # --- helpers --------------------------------------------------------------------
    def _open_request(self, request_id: str, action: str) -> Request:
        request = self.requests.get(request_id)
        if request is None:
            raise UnknownRequestError(f"{action}: no request {request_id!r}")
        if request.is_finished or request.context_complete:
            raise EngineInputError(f"{action}: request {request_id!r} is already finished")
        return request

    def _invalidate_from(self, request: Request, valid: int) -> int:
        """Drop KV from token `valid` on; returns the computed tokens left."""
        copies = self.scheduler.truncate(request, valid)
        if copies:
            self.runner.copy_blocks(copies)
        return request.num_computed_tokens

    def _encode(self, segments: Sequence[Segment]) -> list[int]:
        ids = self.tokenizer.encode_all(segments)
        vocab = self.runner.config.vocab_size
        for segment in segments:
            if segment.token_ids is not None and any(not 0 <= t < vocab for t in segment.token_ids):
                raise EngineInputError(f"token ids must be in [0, {vocab})")
        return ids

    def _set_prompt(self, request: Request, tokens: list[int]) -> None:
        self._check_fits(request, tokens)
        request.prompt_token_ids = tokens

    def _check_fits(self, request: Request, tokens: list[int]) -> None:
        limit = self.max_sequence_tokens - 1   # room for at least one generated token
        if len(tokens) > limit:
            raise PromptTooLongError(
                f"prompt too long: {len(tokens)} tokens; the limit is {limit} (model context "
                f"{self.max_model_len}, device pool {self.scheduler.capacity_tokens} tokens)")

    def _finish(self, request: Request, reason: FinishReason) -> None:
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.stats.finish_time = self.clock()
        self.scheduler.remove(request)
        self.sampler.forget(request.request_id)
        self.speculation.remove(request.request_id)
        output = self._outputs.pop(request.request_id, None)
        if output is not None:
            request.output_text = output.final
        self.counters.requests_finished += 1
        self._emit(request, EventKind.FINISHED, detail=reason.value)

    def release(self, request_id: str) -> Request | None:
        """Forget a finished request (the caller has read its stats)."""
        return self.scheduler.release(request_id)

    def _emit(self, request: Request, kind: EventKind, *, count: int = 0, token_id: int | None = None,
              text: str = "", detail: str = "") -> None:
        self._events.append(EngineEvent(request.request_id, kind, self.clock(), count, token_id, text, detail))


def lcp_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
