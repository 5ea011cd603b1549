"""An optional per-step log: one JSON line per engine step, for event timelines in benchmarks.

Set `STREAMRAG_STEP_LOG=PREFIX` for the native engine (`STREAMRAG_VLLM_STEP_LOG` for our
scheduler class inside vLLM) and each service process appends to `PREFIX.<pid>.jsonl`. Every
line has `t` (wall time at the step's start, `time.time()`), `scheduled` (request id -> tokens
this step) and `complete` (the ids among them whose context was complete); a backend adds its
own counters (the native engine: `budget`, the step's token budget, `step_ms`, its wall time from
scheduling to sampling, and, when steps are bounded in time, `predicted_ms`, what the step-time model
of step_budget.py predicted for it). `gc_ms` is the time the process spent in Python's garbage collector since the
previous line, and `gc_gen2` how many of those collections were full (generation 2) ones: a step
that takes far longer than its tokens explain can be checked against it. `streamrag bench who`
reads the log beside a `bench replay` run: whose work ran while a slow request waited for its
first token.
"""

from __future__ import annotations

import gc
import json
import os
import time
from typing import Any, TextIO

STEP_LOG_ENV = "STREAMRAG_STEP_LOG"


class StepLog:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gc_started: float | None = None
        self._gc_s = 0.0
        self._gc_gen2 = 0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self._gc_s += time.perf_counter() - self._gc_started
            self._gc_gen2 += info.get("generation") == 2
            self._gc_started = None

    @classmethod
    def from_env(cls, variable: str = STEP_LOG_ENV) -> StepLog | None:
        """The log named by the environment variable (its value plus `.<pid>.jsonl`), or None when unset."""
        prefix = os.environ.get(variable)
        if not prefix:
            return None
        return cls(open(f"{prefix}.{os.getpid()}.jsonl", "a", encoding="utf-8"))

    def write(self, t: float, scheduled: dict[str, int], complete: list[str], **counters: Any) -> None:
        gc_ms, gc_gen2 = round(self._gc_s * 1000, 1), self._gc_gen2
        self._gc_s, self._gc_gen2 = 0.0, 0
        self._stream.write(json.dumps({"t": round(t, 4), **counters, "gc_ms": gc_ms, "gc_gen2": gc_gen2,
                                       "scheduled": scheduled, "complete": complete}) + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._stream.close()
