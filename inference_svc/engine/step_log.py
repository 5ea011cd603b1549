"""An optional per-step log: one JSON line per engine step, for event timelines in benchmarks.

Set `STREAMRAG_STEP_LOG=PREFIX` for the native engine (`STREAMRAG_VLLM_STEP_LOG` for our
scheduler class inside vLLM) and each service process appends to `PREFIX.<pid>.jsonl`. Every
line has `t` (wall time at the step's start, `time.time()`), `scheduled` (request id -> tokens
this step) and `complete` (the ids among them whose context was complete); a backend adds its
own counters. `python -m load_tests.who` reads it beside a `bench replay` run: whose work ran
while a slow request waited for its first token.
"""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

STEP_LOG_ENV = "STREAMRAG_STEP_LOG"


class StepLog:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @classmethod
    def from_env(cls, variable: str = STEP_LOG_ENV) -> StepLog | None:
        """The log named by the environment variable (its value plus `.<pid>.jsonl`), or None when unset."""
        prefix = os.environ.get(variable)
        if not prefix:
            return None
        return cls(open(f"{prefix}.{os.getpid()}.jsonl", "a", encoding="utf-8"))

    def write(self, t: float, scheduled: dict[str, int], complete: list[str], **counters: Any) -> None:
        self._stream.write(json.dumps({"t": round(t, 4), **counters, "scheduled": scheduled,
                                       "complete": complete}) + "\n")
        self._stream.flush()
