"""Scheduling policies: each ranks the unfinished requests, highest priority first.

A policy is one small class with `order`; eviction takes requests in the reverse order
(lowest priority first) unless the policy says otherwise. Adding a policy means writing a
class here and listing it in `POLICIES`; the scheduler does not change.

- `default`: vLLM-like. Requests holding device KV keep their admission order; waiting
  requests follow, preempted ones at the front (most recently preempted first), then by
  arrival. Eviction takes the last admitted first (LIFO). The paper's vLLM-S.
- `fcfs`: complete-context tier first, then partial; each tier by arrival.
- `lcas`: the same two tiers, most recent chunk arrival first; a request passed over for
  longer than `starvation_s` jumps ahead of both tiers (oldest starved first).
- `mcps`: most computed tokens first, ties by arrival.
- `klpm`: k-LPM: the oldest request, then the k-1 requests with the longest cached prefix,
  repeated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inference_svc.engine.request import Request, RequestState


@dataclass(frozen=True)
class PolicyContext:
    now: float
    cached_prefix_tokens: Callable[[Request], int] = lambda request: 0


class Policy:
    name = "base"

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        raise NotImplementedError

    def eviction_order(self, ranked: Sequence[Request]) -> list[Request]:
        return list(reversed(ranked))


class DefaultPolicy(Policy):
    name = "default"

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        holding = sorted((r for r in requests if r.state is RequestState.RUNNING), key=lambda r: r.admitted_seq)
        others = [r for r in requests if r.state is not RequestState.RUNNING]
        preempted = sorted((r for r in others if r.preempted_at is not None),
                           key=lambda r: (-r.preempted_at, r.arrival_time))
        fresh = sorted((r for r in others if r.preempted_at is None), key=lambda r: r.arrival_time)
        return holding + preempted + fresh


class FCFSPolicy(Policy):
    name = "fcfs"

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        return sorted(requests, key=lambda r: (not r.context_complete, r.arrival_time))


class LCASPolicy(Policy):
    name = "lcas"

    def __init__(self, starvation_s: float = 5.0) -> None:
        self.starvation_s = starvation_s

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        def starved(r: Request) -> bool:
            return r.passed_over_since is not None and ctx.now - r.passed_over_since > self.starvation_s

        rescued = sorted((r for r in requests if starved(r)), key=lambda r: r.passed_over_since)
        rest = sorted((r for r in requests if not starved(r)),
                      key=lambda r: (not r.context_complete, -r.last_chunk_arrival_time, r.arrival_time))
        return rescued + rest


class MCPSPolicy(Policy):
    name = "mcps"

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        return sorted(requests, key=lambda r: (-r.num_computed_tokens, r.arrival_time))


class KLPMPolicy(Policy):
    name = "klpm"

    def __init__(self, k: int = 2) -> None:
        if k < 1:
            raise ValueError("k-LPM needs k >= 1")
        self.k = k

    def order(self, requests: Sequence[Request], ctx: PolicyContext) -> list[Request]:
        by_age = sorted(requests, key=lambda r: r.arrival_time)
        by_match = sorted(by_age, key=lambda r: -ctx.cached_prefix_tokens(r))  # stable: ties by age
        taken: set[int] = set()
        ranked: list[Request] = []
        oldest, matched = iter(by_age), iter(by_match)
        while len(ranked) < len(requests):
            for source, count in ((oldest, 1), (matched, self.k - 1)):
                picked = 0
                while picked < count and len(ranked) < len(requests):
                    request = next(source)
                    if id(request) not in taken:
                        taken.add(id(request))
                        ranked.append(request)
                        picked += 1
        return ranked


POLICIES: dict[str, Callable[[], Policy]] = {
    "default": DefaultPolicy,
    "fcfs": FCFSPolicy,
    "lcas": LCASPolicy,
    "mcps": MCPSPolicy,
    "klpm": KLPMPolicy,
}


def make_policy(name: str, **options: float) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return factory(**options)
