"""Scheduling policies: each ranks the unfinished requests, highest priority first.

A policy is one small class with `order`; eviction takes requests in the reverse order
(lowest priority first) unless the policy says otherwise. Adding a policy means writing a
class here and listing it in `POLICIES`; the scheduler does not change.

- `default`: vLLM-like. Requests holding device KV keep their admission order; waiting
  requests follow, preempted ones at the front (most recently preempted first), then by
  arrival. Eviction takes the last admitted first (LIFO). The paper's vLLM-S.
- `fcfs`: complete-context tier first, then partial. A complete prompt is served in the order
  its context completed, which is the order a non-streaming server receives the same prompts in,
  so streaming never puts a prompt behind one that non-streaming would serve after it; partial
  prompts by arrival. Without streaming (context complete at arrival) this is arrival order.
- `lcas`: the same two tiers, most recent chunk arrival first; a request passed over for
  longer than `starvation_s` jumps ahead of both tiers (oldest starved first).
- `mcps`: most computed tokens first, ties by arrival.
- `klpm`: k-LPM: the oldest request, then the k-1 requests with the longest cached prefix,
  repeated.

Between tenants, `make_policy(..., fair_share=True)` (the service's default: `--fair-share`) wraps the
policy in `fair_share.FairSharePolicy` (weighted virtual token counters): the policy then orders each
tenant's requests.

Ordering runs every engine step over every unfinished request, so the policies avoid
tuple sort keys: a multi-key order is built from stable single-key sorts (least significant
key first; `reverse=True` keeps ties in input order) and stable tier partitions, which gives
exactly the order of the documented tuple key, ties included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from inference_svc.engine.fair_share import FairSharePolicy
from inference_svc.engine.request import Request, RequestState

_arrival = attrgetter("arrival_time")
_admitted_seq = attrgetter("admitted_seq")
_preempted_at = attrgetter("preempted_at")
_passed_over_since = attrgetter("passed_over_since")
_last_chunk_arrival = attrgetter("last_chunk_arrival_time")
_computed = attrgetter("num_computed_tokens")


@dataclass(frozen=True)
class PolicyContext:
    now: float
    cached_prefix_tokens: Callable[[Request], int] = lambda request: 0
    # Optional batch form of `cached_prefix_tokens` (same values, one list for many requests);
    # the scheduler supplies it so k-LPM can skip the per-request calls when nothing is cached.
    cached_prefix_tokens_many: Callable[[Sequence[Request]], list[int]] | None = None

    def prefix_tokens_of(self, requests: Sequence[Request]) -> list[int]:
        if self.cached_prefix_tokens_many is not None:
            return self.cached_prefix_tokens_many(requests)
        return list(map(self.cached_prefix_tokens, requests))


class Policy:
    name = "base"

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        raise NotImplementedError

    def eviction_order(self, ranked: Sequence[Request]) -> list[Request]:
        return list(reversed(ranked))

    def charge(self, request: Request, tokens: int) -> None:
        """`tokens` of `request` were scheduled this step (a fair-share policy counts them)."""


def _tiered(ranked: list[Request]) -> list[Request]:
    """Stable partition: complete-context requests first, then partial ones."""
    complete = [r for r in ranked if r.context_complete]
    if len(complete) == len(ranked) or not complete:
        return ranked
    complete += [r for r in ranked if not r.context_complete]
    return complete


class DefaultPolicy(Policy):
    name = "default"

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        running = RequestState.RUNNING
        holding = [r for r in requests if r.state is running]
        holding.sort(key=_admitted_seq)
        if not holding:
            others = sorted(requests, key=_arrival)
        elif len(holding) == len(requests):
            return holding
        else:
            others = sorted([r for r in requests if r.state is not running], key=_arrival)
        # key (-preempted_at, arrival_time): arrival-sorted, then a stable descending sort
        preempted = [r for r in others if r.preempted_at is not None]
        if not preempted:
            holding += others
            return holding
        preempted.sort(key=_preempted_at, reverse=True)
        holding += preempted
        if len(preempted) < len(others):
            holding += [r for r in others if r.preempted_at is None]
        return holding


class FCFSPolicy(Policy):
    name = "fcfs"

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        # key (not context_complete, last_chunk_arrival_time if complete else arrival_time, arrival_time)
        ranked = sorted(requests, key=_arrival)
        complete = [r for r in ranked if r.context_complete]
        if not complete:
            return ranked
        complete.sort(key=_last_chunk_arrival)
        if len(complete) == len(ranked):
            return complete
        return complete + [r for r in ranked if not r.context_complete]


class LCASPolicy(Policy):
    name = "lcas"

    def __init__(self, starvation_s: float = 5.0) -> None:
        self.starvation_s = starvation_s

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        now, starvation_s = ctx.now, self.starvation_s
        rescued = [r for r in requests if (since := r.passed_over_since) is not None and now - since > starvation_s]
        rest = requests
        if rescued:
            rescued.sort(key=_passed_over_since)
            rest = [r for r in requests
                    if r.passed_over_since is None or not now - r.passed_over_since > starvation_s]
        # key (not context_complete, -last_chunk_arrival_time, arrival_time)
        ranked = sorted(rest, key=_arrival)
        ranked.sort(key=_last_chunk_arrival, reverse=True)
        ranked = _tiered(ranked)
        if rescued:
            rescued += ranked
            return rescued
        return ranked


class MCPSPolicy(Policy):
    name = "mcps"

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        # key (-num_computed_tokens, arrival_time)
        ranked = sorted(requests, key=_arrival)
        ranked.sort(key=_computed, reverse=True)
        return ranked


class KLPMPolicy(Policy):
    name = "klpm"

    def __init__(self, k: int = 2) -> None:
        if k < 1:
            raise ValueError("k-LPM needs k >= 1")
        self.k = k

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        by_age = sorted(requests, key=_arrival)
        if self.k == 1:
            return by_age
        n = len(by_age)
        match = ctx.prefix_tokens_of(by_age)  # one call per request, in age order
        if sorted(match, reverse=True) == match:
            return by_age  # the longest-match order is the age order: so is the interleaving
        # indices into by_age, longest match first, stable (ties by age)
        by_match = sorted(range(n), key=match.__getitem__, reverse=True)
        taken = bytearray(n)
        ranked: list[Request] = []
        oldest = matched = 0
        per_round = self.k - 1
        while len(ranked) < n:
            while taken[oldest]:
                oldest += 1
            taken[oldest] = 1
            ranked.append(by_age[oldest])
            picked = 0
            while picked < per_round and len(ranked) < n:
                index = by_match[matched]
                matched += 1
                if not taken[index]:
                    taken[index] = 1
                    ranked.append(by_age[index])
                    picked += 1
        return ranked


POLICIES: dict[str, Callable[[], Policy]] = {
    "default": DefaultPolicy,
    "fcfs": FCFSPolicy,
    "lcas": LCASPolicy,
    "mcps": MCPSPolicy,
    "klpm": KLPMPolicy,
}


def make_policy(name: str, fair_share: bool = False, **options: float) -> Policy | FairSharePolicy:
    """The policy `name` with its `options`; with `fair_share`, shared between tenants (fair_share.py)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    policy = factory(**options)
    return FairSharePolicy(policy) if fair_share else policy
