"""Staged search, the AquaPipe way: search with a growing candidate list size L, merging as it goes.

Every stage's top-k is merged with what earlier stages found. Distances are exact, so an
item of the true top-k, once found, never leaves the list: recall never drops from one stage
to the next. Shared by the bundled index (`anns.index.AnnsIndex`) and live collections.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

# (query vector, k, L) -> (ids, squared distances), best first
SearchFn = Callable[[object, int, int], tuple[list[int], list[float]]]


@dataclass(frozen=True)
class Stage:
    index: int
    search_list_size: int
    rows: list[int]              # merged top-k ids, best first
    distances: list[float]       # squared L2 between unit vectors: 2 - 2 cos
    elapsed_s: float             # from the start of the staged search to this stage's list
    changed: bool                # the list differs from the previous stage's
    final: bool


def effective_schedule(schedule: Sequence[int], k: int) -> list[int]:
    """Each L raised to at least k; sizes that become equal are searched once."""
    sizes: list[int] = []
    for size in schedule:
        size = max(size, k)
        if not sizes or size > sizes[-1]:
            sizes.append(size)
    return sizes


def staged(search: SearchFn, vector, k: int, schedule: Sequence[int]) -> Iterator[Stage]:
    """Search at each L of the schedule in turn (one search per `next`), merging as it goes."""
    sizes = effective_schedule(schedule, k)
    best: dict[int, float] = {}
    previous: list[int] = []
    started = time.perf_counter()
    for index, size in enumerate(sizes):
        rows, distances = search(vector, k, size)
        for row, distance in zip(rows, distances, strict=True):
            best[row] = min(distance, best.get(row, distance))
        top = sorted(best.items(), key=lambda item: (item[1], item[0]))[:k]
        best = dict(top)
        current = [row for row, _ in top]
        yield Stage(index, size, current, [d for _, d in top], time.perf_counter() - started,
                    current != previous, index == len(sizes) - 1)
        previous = current


def exact_top(vectors, vector, k: int) -> list[int]:
    """Brute-force top-k positions of `vectors` by inner product (unit vectors: nearest first)."""
    import numpy as np

    k = min(k, len(vectors))
    if k == 0:
        return []
    scores = np.asarray(vectors @ vector)
    top = np.argpartition(-scores, k - 1)[:k]
    return top[np.argsort(-scores[top], kind="stable")].tolist()
