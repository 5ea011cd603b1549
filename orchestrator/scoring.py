"""FlowGuard-style replica scoring (StreamServe §3.3): one breakdown per available replica.

Per replica, from its latest `Inference.GetStats` snapshot, each quantity is in [0, 1]:

    C  locality     1 if the replica served this prefix key (the instruction preamble) among
                    its last `locality_window` keys (`ReplicaRouter.note_served`), else 0: its
                    prefix cache probably still holds those blocks
    M  memory use   1 - free / total blocks of the "device" KV pool (0 without that pool)
    Q  queue        q / max(q of every available replica), q = num_waiting + num_swapped;
                    0 when every queue is empty (the paper's Q_w / Q_max)
    L  load         min(1, (num_active + routed) / max_concurrent_streams), where `routed`
                    counts the requests the router sent there since that snapshot, so a
                    burst between two refreshes spreads instead of piling onto one replica

    score S = w_C·C + w_M·(1 - M) + w_Q·(1 - Q) + w_L·(1 - L)

with the weights normalised to sum 1 (default 0.4 / 0.1 / 0.3 / 0.2), so S is in [0, 1] and
higher is better. A replica is overloaded when M > overload_threshold or L > overload_threshold.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from protos import inference_pb2

DEFAULT_WEIGHTS = (0.4, 0.1, 0.3, 0.2)   # locality, memory, queue, load


class Scored(Protocol):
    """What scoring reads of a replica (`orchestrator.router.Replica`)."""

    address: str
    stats: inference_pb2.EngineStats | None
    routed: int
    recent_keys: Collection[str]


@dataclass(frozen=True)
class ScoreBreakdown:
    """One replica's inputs to a decision (C, M, Q, L as in the module docstring) and its score."""

    locality: float
    memory_use: float
    queue: float
    load: float
    score: float
    overloaded: bool
    queue_depth: int    # q = waiting + swapped
    active: int         # num_active + routed since the snapshot

    def __str__(self) -> str:
        text = (f"S={self.score:.3f} C={self.locality:.0f} M={self.memory_use:.2f} Q={self.queue:.2f} "
                f"L={self.load:.2f} q={self.queue_depth} active={self.active}")
        return f"{text} OVERLOADED" if self.overloaded else text


def normalised_weights(weights: Sequence[float]) -> tuple[float, ...]:
    """The four weights scaled to sum 1; ValueError for anything but four non-negative numbers with a positive sum."""
    if len(weights) != 4 or any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be 4 non-negative numbers (locality, memory, queue, load) "
                         f"with a positive sum, got {tuple(weights)}")
    total = sum(weights)
    return tuple(w / total for w in weights)


def score_replicas(replicas: Sequence[Scored], prefix_key: str, weights: Sequence[float],
                   overload_threshold: float) -> dict[str, ScoreBreakdown]:
    """The breakdown of each of `replicas` (each with a snapshot), in their order."""
    depths = {r.address: queue_depth(r.stats) for r in replicas}
    deepest = max(depths.values(), default=0)
    w_c, w_m, w_q, w_l = weights
    out = {}
    for r in replicas:
        stats = r.stats
        locality = 1.0 if prefix_key and prefix_key in r.recent_keys else 0.0
        memory_use = device_memory_use(stats)
        queue = depths[r.address] / deepest if deepest else 0.0
        active = stats.num_active + r.routed
        load = min(1.0, active / stats.max_concurrent_streams) if stats.max_concurrent_streams > 0 else 0.0
        score = w_c * locality + w_m * (1 - memory_use) + w_q * (1 - queue) + w_l * (1 - load)
        overloaded = memory_use > overload_threshold or load > overload_threshold
        out[r.address] = ScoreBreakdown(locality, memory_use, queue, load, score, overloaded, depths[r.address], active)
    return out


def queue_depth(stats: inference_pb2.EngineStats) -> int:
    return stats.num_waiting + stats.num_swapped


def device_memory_use(stats: inference_pb2.EngineStats) -> float:
    for pool in stats.pools:
        if pool.name == "device" and pool.total_blocks > 0:
            return min(1.0, max(0.0, 1 - pool.free_blocks / pool.total_blocks))
    return 0.0
