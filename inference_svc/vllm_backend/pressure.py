"""Recompute eviction of idle streaming sessions when vLLM stalls on KV memory.

A streaming-input session keeps its KV blocks between turns (vLLM's `WAITING_FOR_STREAMING_REQ`),
and vLLM's scheduler never preempts such a session: it preempts only running requests. With a small
KV pool and many sessions open, the idle sessions can hold every block while the requests that have
work wait for blocks that never come: no request runs, every step is empty, and nothing finishes
until the callers' deadlines (docs/results.md, "Memory pressure": 22 requests waiting, 0 running,
1 of 66 blocks free, 225,000 empty steps).

`IdleSessionEvictor` watches for that stall from the backend's side, where both halves are known:
vLLM's step counters (running requests, steps taken, KV blocks in use) and which of our requests
have a submitted turn or prompt pending (and how many tokens) and which are idle sessions. When the
engine keeps stepping with nothing running while some request has work pending that needs more
blocks than are free, for `patience` polls in a row, it evicts one idle session (without the block
check it also fired without any memory pressure: nothing runs for a moment between turns, 17
evictions in a run whose pool never fell below 253 free blocks of 364). Any pending request that
does not fit counts, not only the smallest: vLLM's scheduler stops at the first waiting request it
cannot allocate blocks for, so smaller work ranked behind it waits too (with a check on the smallest
need, a stall behind one large turn went unseen: a possible cause, not confirmed, of the pressure
stall of seed 0 in docs/results.md, "Not measured yet"). The victim is the idle
session our policy ranks last (the same `PolicyRanker` and policy definitions the scheduler class
uses; fcfs: the newest partial prompt). Eviction ends the session's vLLM request
(its blocks go back to the pool, still hashed for the prefix cache); its next chunk, or `finish`,
submits the prompt again (recompute). vLLM's own scheduler (`--policy default`, vLLM-S) runs
without it: that baseline is vLLM as it is.

Duck-typed, no vllm import: `requests` are `VllmRequest`s (session.py), `counters` the stat
logger's `VllmCounters` (engine.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from inference_svc.engine.policies import Policy
from inference_svc.vllm_backend.ranking import PolicyRanker, stream_marks

log = logging.getLogger(__name__)
POLL_S = 0.05
PATIENCE = 3          # stalled polls in a row before an eviction (a fresh turn may wait a step or two)


@dataclass(slots=True)
class SessionView:
    """An idle session as `PolicyRanker` reads a vLLM request (the attributes ranking.py uses)."""

    request_id: str
    arrival_time: float
    sampling_params: Any
    num_computed_tokens: int
    num_preemptions: int
    status: str = "WAITING_FOR_STREAMING_REQ"
    streaming_queue: tuple = field(default=())


class IdleSessionEvictor:
    def __init__(self, counters: Any, requests: Callable[[], Iterable[Any]], policy: Policy | str,
                 total_blocks: int, block_size: int, patience: int = PATIENCE) -> None:
        self.counters = counters
        self.requests = requests
        self.total_blocks, self.block_size = total_blocks, block_size
        self.ranker = PolicyRanker(policy)
        self.patience = patience
        self.evictions = 0
        self._stalled = 0
        self._last_steps = -1

    def poll(self) -> Any | None:
        """One look at the engine; returns the request evicted, if any."""
        with self.counters.lock:
            steps, running, usage = self.counters.steps, self.counters.num_running, self.counters.kv_cache_usage
        free_blocks = self.total_blocks - round(usage * self.total_blocks)
        requests = list(self.requests())
        idle = [r for r in requests if r.idle_session]
        needs = [-(-r.pending_tokens // self.block_size) for r in requests if r.has_pending_work]
        starved = any(need > free_blocks for need in needs)     # and vLLM stops at the first that does not fit
        stepping = steps > self._last_steps >= 0
        self._last_steps = steps
        if not (starved and idle and stepping and running == 0):
            self._stalled = 0
            return None
        self._stalled += 1
        if self._stalled < self.patience:
            return None
        self._stalled = 0
        victim = self.lowest_ranked(idle)
        victim.evict()
        self.evictions += 1
        log.info("KV stall (nothing running, %d free blocks, %d idle sessions): evicted %s", free_blocks, len(idle),
                 victim.request_id)
        return victim

    def lowest_ranked(self, idle: list[Any]) -> Any:
        """The idle session our policy ranks last."""
        views = [SessionView(r.request_id, r.opened_wall, _Marks(r.last_chunk_wall), r.submitted_tokens,
                             r.stats.preemptions_recompute) for r in idle]
        of_view = {id(v): r for v, r in zip(views, idle, strict=True)}
        ranked = self.ranker.rank(views, now=time.time())
        self.ranker.forget(r.request_id for r in idle)
        return of_view[id(ranked[-1])]

    async def run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                self.poll()
            except Exception:   # never let a bad poll end the watch
                log.exception("idle-session eviction check failed")


@dataclass(slots=True)
class _Marks:
    """`sampling_params` of an idle session: partial, last chunk at `chunk_at` (wall clock)."""

    chunk_at: float
    extra_args: dict = field(init=False)

    def __post_init__(self) -> None:
        self.extra_args = stream_marks(complete=False, chunk_at=self.chunk_at)
