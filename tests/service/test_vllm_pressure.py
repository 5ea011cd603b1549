"""The vLLM backend's idle-session eviction (`inference_svc/vllm_backend/pressure.py`) on stand-ins
for `VllmRequest` and vLLM's step counters (the seam: the stall itself needs a vLLM engine with a
tiny KV pool, measured in docs/benchmarks.md). No vllm import."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from inference_svc.engine.request import RequestStats
from inference_svc.vllm_backend.pressure import IdleSessionEvictor

BLOCKS, BLOCK = 66, 128


@dataclass
class Counters:
    steps: int = 0
    num_running: int = 0
    kv_cache_usage: float = 65 / 66        # one block free
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class FakeRequest:
    request_id: str
    opened_wall: float
    last_chunk_wall: float
    idle_session: bool = True
    has_pending_work: bool = False
    submitted_tokens: int = 100
    pending_tokens: int = 600             # 5 blocks
    stats: RequestStats = field(default_factory=RequestStats)
    evicted: bool = False

    def evict(self) -> None:
        self.evicted, self.idle_session = True, False


def stalled_polls(evictor: IdleSessionEvictor, counters: Counters, n: int) -> list:
    out = []
    for _ in range(n):
        counters.steps += 10       # the engine keeps stepping, nothing runs
        out.append(evictor.poll())
    return out


def test_a_stall_evicts_the_idle_session_fcfs_ranks_last_after_patience_polls():
    counters = Counters(steps=1)
    older = FakeRequest("older", opened_wall=100.0, last_chunk_wall=105.0)
    newer = FakeRequest("newer", opened_wall=200.0, last_chunk_wall=201.0)
    waiting = FakeRequest("waiting", 50.0, 50.0, idle_session=False, has_pending_work=True)
    evictor = IdleSessionEvictor(counters, lambda: [older, newer, waiting], "fcfs", BLOCKS, BLOCK, patience=3)
    evictor.poll()                                    # first look: no step seen yet
    assert stalled_polls(evictor, counters, 2) == [None, None]
    assert stalled_polls(evictor, counters, 1) == [newer]          # fcfs: the newest arrival ranks last
    assert newer.evicted and not older.evicted and evictor.evictions == 1


def test_lcas_evicts_the_session_whose_last_chunk_is_oldest():
    counters = Counters(steps=1)
    early_recent = FakeRequest("early-recent", opened_wall=100.0, last_chunk_wall=300.0)
    late_stale = FakeRequest("late-stale", opened_wall=200.0, last_chunk_wall=210.0)
    waiting = FakeRequest("waiting", 50.0, 50.0, idle_session=False, has_pending_work=True)
    evictor = IdleSessionEvictor(counters, lambda: [early_recent, late_stale, waiting], "lcas", BLOCKS, BLOCK,
                                 patience=1)
    evictor.poll()
    assert stalled_polls(evictor, counters, 1) == [late_stale]


def test_no_eviction_while_something_runs_nothing_waits_or_the_engine_is_not_stepping():
    counters = Counters(steps=1)
    idle = FakeRequest("idle", 100.0, 100.0)
    waiting = FakeRequest("waiting", 50.0, 50.0, idle_session=False, has_pending_work=True)
    requests = [idle, waiting]
    evictor = IdleSessionEvictor(counters, lambda: requests, "fcfs", BLOCKS, BLOCK, patience=1)
    evictor.poll()
    counters.num_running = 1                          # progress: something runs
    assert stalled_polls(evictor, counters, 3) == [None] * 3
    counters.num_running = 0
    assert [evictor.poll() for _ in range(3)] == [None] * 3        # steps do not advance: the engine is idle
    waiting.has_pending_work = False                  # nobody waits for blocks
    assert stalled_polls(evictor, counters, 3) == [None] * 3
    waiting.has_pending_work = True
    counters.kv_cache_usage = 0.5                     # the pending work fits: nothing runs only for a moment
    assert stalled_polls(evictor, counters, 3) == [None] * 3
    counters.kv_cache_usage = 60 / 66                 # 6 blocks free, the 5 the pending work needs
    assert stalled_polls(evictor, counters, 3) == [None] * 3
    assert not idle.evicted
    counters.kv_cache_usage = 65 / 66
    assert stalled_polls(evictor, counters, 1) == [idle]


def test_a_large_pending_turn_stalls_the_engine_even_when_smaller_pending_work_would_fit():
    # vLLM stops at the first waiting request it cannot allocate for: the small prompt ranked behind
    # the large turn waits too, so nothing runs although the small one alone would fit.
    counters = Counters(steps=1, kv_cache_usage=60 / 66)             # 6 blocks free
    idle = FakeRequest("idle", 100.0, 100.0)
    large = FakeRequest("large", 50.0, 50.0, idle_session=False, has_pending_work=True, pending_tokens=2000)
    small = FakeRequest("small", 60.0, 60.0, idle_session=False, has_pending_work=True, pending_tokens=200)
    evictor = IdleSessionEvictor(counters, lambda: [idle, large, small], "fcfs", BLOCKS, BLOCK, patience=2)
    evictor.poll()
    assert stalled_polls(evictor, counters, 2) == [None, idle]
