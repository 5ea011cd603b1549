"""Fair share between tenants: weighted virtual token counters (VTC, Sheng et al., OSDI 2024).

Each tenant has a counter of the tokens the replica computed for it, divided by its weight. The
tenant with the smallest counter is served first, so a tenant that floods the replica cannot take
another's share, and one that asks little is served as soon as it asks:

- a request is charged as it is computed, step by step: a prefill chunk's tokens when the chunk
  runs (a streamed prompt is charged as its chunks arrive and are prefilled, not at admission), a
  decode token when it is generated;
- a tenant that comes back after idling (no unfinished request at the previous step) is lifted to
  the smallest counter of the tenants that stayed backlogged, so idling earns no credit; when none
  stayed, to the level the backlogged tenants had last reached (VTC's counter of the last to leave),
  and the returning tenants start level with each other. So a tenant seen for the first time (or
  back after everyone idled) does not start at zero behind one that was served before it, and the
  one served before does not wait while it catches up. An idle session's state (an INGEST-class
  request with nothing to compute: it never finishes) keeps no tenant backlogged, so a session open
  for hours earns its tenant no credit either.

`FairSharePolicy` wraps a policy (policies.py): decoding requests keep the policy's order, first (a
decode is one token a step, and VTC lets an admitted request run: a tenant's answer is never held
behind another tenant's prefill once it streams). Every other request is ordered per tenant by the
policy (today's fcfs, lcas, mcps or k-LPM), then by `priority` (a stable sort, lower first); and the
tenants' queues are merged by counter, each step: the next request
is the head of the queue whose counter, with the requests already placed before it charged at their
pending tokens, is smallest. So a light tenant's new request goes before a flood's prefills in
progress, and the two take turns only while their counters are level. With one tenant the order is
the policy's (by priority among the waiting). Eviction takes the order from its end (the scheduler's
cost model still chooses swap or recompute).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from inference_svc.engine.request import RequestState, SchedClass

_priority = attrgetter("priority")


@dataclass(frozen=True)
class Share:
    """Who a request is served for: its tenant ("" for everyone without one) and the tenant's weight."""

    tenant: str = ""
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"a tenant's weight must be positive, got {self.weight}")


NO_SHARE = Share()


class VirtualTokenCounters:
    """Tokens served per tenant, weighted; and which tenants were backlogged at the last step."""

    def __init__(self) -> None:
        self.served: dict[str, float] = {}
        self.backlogged: set[str] = set()
        self.level = 0.0              # the smallest backlogged counter, as last seen: never goes down

    def counter(self, tenant: str) -> float:
        return self.served.get(tenant, 0.0)

    def note_backlogged(self, tenants: Iterable[str]) -> None:
        """This step's tenants with unfinished requests; those that were not backlogged before are lifted."""
        now = set(tenants)
        if self.backlogged:
            self.level = max(self.level, min(self.counter(t) for t in self.backlogged))
        returning = now - self.backlogged
        if returning:
            stayed = now & self.backlogged
            floor = (min(self.counter(t) for t in stayed) if stayed
                     else max(self.level, *(self.counter(t) for t in returning)))
            for tenant in returning:
                self.served[tenant] = max(self.counter(tenant), floor)
        self.backlogged = now

    def charge(self, tenant: str, tokens: int, weight: float) -> None:
        """`tokens` computed for `tenant` (prefill or decode), counted as `tokens / weight`."""
        if tokens > 0:
            self.served[tenant] = self.counter(tenant) + tokens / weight


def _decoding(request) -> bool:
    """Past its prompt and generating (a request without `is_decoding`, vLLM's view: holding KV)."""
    decoding = getattr(request, "is_decoding", None)
    return decoding if decoding is not None else getattr(request, "state", None) is RequestState.RUNNING


def _pending(request) -> int:
    pending = getattr(request, "num_schedulable_tokens", None)
    if pending is None:
        pending = getattr(request, "num_pending_tokens", 1)
    return int(pending)


def pending_cost(request) -> int:
    """The tokens a request would be charged if served now (at least 1: a decode)."""
    return max(_pending(request), 1)


def keeps_backlog(request) -> bool:
    """An unfinished request keeps its tenant backlogged, but an idle session's state does not (see above)."""
    return getattr(request, "sched_class", None) is not SchedClass.INGEST or _pending(request) > 0


class FairSharePolicy:
    """`inner`'s order within each tenant; tenants merged by weighted virtual token counters. A policy
    (policies.py's interface: `name`, `order`, `eviction_order`, `charge`) around a policy."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.counters = VirtualTokenCounters()

    def order(self, requests: Sequence, ctx: Any) -> list:
        ranked = self.inner.order(requests, ctx)
        self.counters.note_backlogged({request.tenant for request in ranked if keeps_backlog(request)})
        running = [r for r in ranked if _decoding(r)]
        queues: dict[str, list] = {}
        for request in ranked:
            if not _decoding(request):
                queues.setdefault(request.tenant, []).append(request)
        for queue in queues.values():
            if any(r.priority for r in queue):
                queue.sort(key=_priority)           # stable: the policy's order among equals
        if len(queues) <= 1:
            return running + next(iter(queues.values()), [])
        heap = [(self.counters.counter(tenant), position, tenant) for position, tenant in enumerate(queues)]
        heapq.heapify(heap)
        heads = dict.fromkeys(queues, 0)
        merged = running
        while heap:
            counter, position, tenant = heapq.heappop(heap)
            queue, head = queues[tenant], heads[tenant]
            request = queue[head]
            merged.append(request)
            heads[tenant] = head + 1
            if head + 1 < len(queue):
                heapq.heappush(heap, (counter + pending_cost(request) / request.tenant_weight, position, tenant))
        return merged

    def eviction_order(self, ranked: Sequence) -> list:
        return self.inner.eviction_order(ranked)

    def charge(self, request, tokens: int) -> None:
        self.counters.charge(request.tenant, tokens, request.tenant_weight)
