"""Stability hints for update-mode (refining) retrieval: how likely each document of a
non-final refinement is to still be there after the next one.

An ANNS search with a growing list size L (AquaPipe-style early results) refines its top-k
stage by stage. What churns is the tail of the list, near the cutoff: measured on the
synthesized ANNS trace of `streamrag bench paper traces` (30 queries, 862 stage-to-stage document
transitions), every document in the top half of a stage's list was still there at the next
stage, and 85-88% of those in the bottom half were, whether they had just entered or not.
So a document's hint is its rank's survival rate: `TOP` in the top half, `TAIL` below. Both
are above the engine's 0.5 threshold, so on this workload nothing is deferred; a retriever
whose tail churns more (a lower TAIL) makes the engine prefill only the top ahead. In the
final stage nothing will change, so no hint is sent.

`stability_hints` is the one rule: the ANNS retriever, the trace replay retriever and the
replay benchmark all use it.
"""

from __future__ import annotations

from collections.abc import Sequence

TOP = 1.0        # top half of a non-final list: measured survival to the next stage 100%
TAIL = 0.85      # bottom half: measured 85-88%


def stability_hints(previous_ids: Sequence[str] | None, current_ids: Sequence[str], final: bool) -> list[float | None]:
    """One hint per current document (best first): None in the final stage (nothing will change),
    else TOP for the top half of the list and TAIL for the rest. `previous_ids` (the last list
    sent, None before the first) is accepted for retrievers that also weigh survival."""
    if final:
        return [None] * len(current_ids)
    half = (len(current_ids) + 1) // 2
    return [TOP if rank < half else TAIL for rank in range(len(current_ids))]
