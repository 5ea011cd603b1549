"""A process known by its pid and its start time, so that a reused pid is never taken for it.

The local stack (`streamrag.stack`) records each service this way; a vLLM replica records itself
as the owner of its `/dev/shm` spool folder (`inference_svc.vllm_backend.kv_spool`).
"""

from __future__ import annotations

import os
from pathlib import Path


def process_start_ticks(pid: int) -> int | None:
    """The process's start time from /proc, in clock ticks (None: no such process, or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()      # after "pid (comm)": state is field 3, starttime field 22
    return None if fields[0] in ("Z", "X") else int(fields[19])


def is_alive(pid: int, started: int) -> bool:
    """True while process `pid` runs and is the one that started at `started` (ticks)."""
    return process_start_ticks(pid) == started


def this_process() -> tuple[int, int]:
    """This process's (pid, start ticks)."""
    pid = os.getpid()
    started = process_start_ticks(pid)
    assert started is not None
    return pid, started
