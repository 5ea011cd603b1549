"""A streaming request: its segments, tokens, progress, state and per-request statistics.

A request's token sequence is `prompt_token_ids + output_token_ids`. The prompt is its head
segments (given at open: instructions, question), then its context segments (which `append`
extends and `update` replaces), then, once the caller calls `finish`, the suffix segments.
Decoding starts only after `finish`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from inference_svc.engine.sampler import SamplingParams


class RequestState(enum.Enum):
    WAITING = "waiting"      # no KV on the device (new, or preempted by recompute)
    RUNNING = "running"      # holds device KV blocks (computing, decoding, or idle awaiting input)
    SWAPPED = "swapped"      # KV parked in the CPU pool
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"            # EOS, a stop token or a stop string
    LENGTH = "length"        # max_tokens, or the model's context is full
    ABORT = "abort"          # cancelled by the caller
    ERROR = "error"


class SchedClass(enum.IntEnum):
    """Scheduling classes, served in this order before any policy's order (sessions, issue 18)."""

    INTERACTIVE = 0     # every ordinary request, and session queries
    INGEST = 1          # a session's data region, prefilled as batches arrive
    BACKGROUND = 2      # Flash Query evaluation: only the capacity everything else leaves


STABLE_THRESHOLD = 0.5      # a segment less likely than this to survive a refinement is not prefilled ahead


@dataclass(frozen=True)
class Segment:
    """One piece of a prompt: text or token ids, optionally keyed (a document id)."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    key: str | None = None
    # The retriever's estimate that this segment survives the next refinement (update mode),
    # 0..1; None: unknown, treated as stable. See `Request.speculative_limit`.
    stability: float | None = None

    @property
    def likely_replaced(self) -> bool:
        return self.stability is not None and self.stability < STABLE_THRESHOLD

    def __post_init__(self) -> None:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("a segment has exactly one of text or token_ids")


@dataclass
class RequestStats:
    """What the engine reports about a request when it ends."""

    arrival_time: float = 0.0
    last_input_time: float = 0.0          # later of the last append/update and finish
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    time_queued_s: float = 0.0
    tokens_computed: int = 0              # every token the model ran over, recomputation included
    tokens_invalidated: int = 0
    prefix_cache_hit_tokens: int = 0
    preemptions_swap: int = 0
    preemptions_recompute: int = 0
    num_appends: int = 0                  # append calls applied
    num_updates: int = 0                  # update calls applied
    draft_tokens: int = 0                 # speculative decoding: drafted tokens verified ...
    accepted_draft_tokens: int = 0        # ... and those the model agreed with (emitted as output)
    kv_reuse: str = "exact"               # the KV reuse mode it ran under; "blend" is never exact
    blend_reused_tokens: int = 0          # blend: prompt tokens whose KV came from the chunk store ...
    blend_recomputed_tokens: int = 0      # ... and of those, the ones recomputed (most deviating)
    chunk_cache_lookups: int = 0          # blend: retrieved passages looked up in the chunk store ...
    chunk_cache_hits: int = 0             # ... and found there

    def note_reuse(self, plan) -> None:
        """Count what a blend-mode chunk reused (`KVCacheManager.plan_reuse`'s `ReusePlan`)."""
        self.chunk_cache_lookups += plan.lookups
        self.chunk_cache_hits += plan.hits
        if plan.reuse is not None:
            self.blend_reused_tokens += plan.reuse.reused_tokens
            self.blend_recomputed_tokens += plan.reuse.recomputed_tokens

    @property
    def ttft_from_open_s(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def ttft_from_last_input_s(self) -> float | None:
        """The paper's TTFT: from the last context chunk (or finish) to the first token."""
        return None if self.first_token_time is None else self.first_token_time - self.last_input_time


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    sampling: SamplingParams
    arrival_time: float
    priority: int = 0                     # lower runs sooner, within its tenant (fair_share.py)
    sched_class: SchedClass = SchedClass.INTERACTIVE
    tenant: str = ""                      # who it is served for, and that tenant's weight (fair_share.py)
    tenant_weight: float = 1.0
    head_segments: list[Segment] = field(default_factory=list)
    context_segments: list[Segment] = field(default_factory=list)
    suffix_segments: list[Segment] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    num_head_tokens: int = 0              # tokens of the head segments: an update keeps them
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""                 # set when the request ends: the text, up to a stop string
    num_computed_tokens: int = 0
    context_complete: bool = False        # finish() was called: no more input, decoding allowed
    # While the context is partial, prefill stops here: the end of the segments that are likely to
    # survive the next refinement (an update's stability hints). None: no limit.
    speculative_limit: int | None = None
    last_chunk_arrival_time: float = 0.0
    state: RequestState = RequestState.WAITING
    finish_reason: FinishReason | None = None
    queued_since: float | None = None     # when it last became runnable-but-not-scheduled
    passed_over_since: float | None = None  # runnable but not chosen since (LCAS anti-starvation)
    preempted_at: float | None = None     # the default policy re-queues preempted requests first
    admitted_seq: int = -1                # order of (re)admission to the device, for LIFO eviction
    # The smallest gap between the two largest logits over the output tokens (Flash Queries'
    # confidence); tracked only when `track_confidence` is set.
    track_confidence: bool = False
    min_logit_gap: float | None = None
    # Blend mode (chunk_store.py): the token spans [start, end) of the keyed context segments (the
    # retrieved passages), and the share of a reused passage's tokens recomputed.
    context_spans: list[tuple[int, int]] = field(default_factory=list)
    blend_recompute: float = 0.0
    stats: RequestStats = field(default_factory=RequestStats)

    def __post_init__(self) -> None:
        self.last_chunk_arrival_time = self.arrival_time
        self.stats.arrival_time = self.arrival_time
        self.stats.last_input_time = self.arrival_time
        self.queued_since = self.arrival_time

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def note_input(self, now: float) -> None:
        """Input arrived at `now` (engine clock: when the caller received it, so that the wait for a
        running step counts towards TTFT)."""
        self.last_chunk_arrival_time = now
        self.stats.last_input_time = now
        if self.state is RequestState.WAITING and self.queued_since is None:
            self.queued_since = now

    @property
    def num_pending_tokens(self) -> int:
        """Tokens known but not yet computed (the work this request can do now)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    @property
    def num_schedulable_tokens(self) -> int:
        """Pending tokens the scheduler may compute now: up to the speculative limit while partial."""
        end = self.num_tokens
        if self.speculative_limit is not None and not self.context_complete:
            end = min(end, self.speculative_limit)
        return end - self.num_computed_tokens

    @property
    def is_runnable(self) -> bool:
        """Has work to do now: tokens to compute (before finish, only prefill, up to the speculative limit)."""
        return not self.is_finished and self.num_schedulable_tokens > 0

    @property
    def expected_keep_fraction(self) -> float:
        """How much of this request's KV is expected to stay valid: 1 once the context is complete
        or final; while update-mode refinements go on, what its updates have left valid so far."""
        if self.context_complete or self.speculative_limit is None or not self.stats.num_updates:
            return 1.0
        computed = max(self.stats.tokens_computed, 1)
        return max(0.0, 1.0 - self.stats.tokens_invalidated / computed)

    @property
    def is_decoding(self) -> bool:
        return self.context_complete and bool(self.output_token_ids)
