"""Our scheduling policies as vLLM request priorities (lower runs sooner, ties by arrival).

vLLM fixes a request's priority when it is added; a streaming-input session keeps the priority
of its first chunk. So only orders that can be decided at submission map:
- `default`: vLLM's FIFO scheduler, priorities ignored (exact: it is vLLM's own behaviour).
- `fcfs`: complete-context tier first, then partial, each by arrival: a submission whose
  context is complete (Generate, or a stream resubmitted after `finish`) gets tier 0, a
  still-growing stream tier 1 (approximate: a session opened partial stays tier 1 after its
  `finish`).
- `lcas`, `mcps`, `klpm`: orders by most recent chunk arrival, computed tokens or prefix
  match change while a request runs; vLLM cannot re-rank a queued request, so they run as
  plain arrival order within the caller's priority hint.
The caller's `priority` hint ranks above the tier in every policy but `default`.
"""

from __future__ import annotations

TIERS = 2


def priority_for(policy: str, hint: int, context_complete: bool) -> int:
    if policy == "default":
        return 0
    tier = 0 if (policy != "fcfs" or context_complete) else 1
    return hint * TIERS + tier
