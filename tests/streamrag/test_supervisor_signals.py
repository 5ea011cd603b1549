"""The supervisor defers SIGTERM while it starts a service and records it, but the service it
starts must not inherit that deferral: `streamrag down` stops it with SIGTERM like any other.
Real processes; the supervisor runs in this process (as in test_stack.py)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from streamrag.stack import plan, processes, state, supervisor


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def blocked_signals(pid: int) -> set[int]:
    """The signals process `pid` blocks, from the SigBlk mask in /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    raise AssertionError(f"no SigBlk line for {pid}")


def test_a_service_the_supervisor_restarts_takes_sigterm(tmp_path: Path):
    (tmp_path / "logs").mkdir()
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    service = plan.Service("corpus", "corpus", "http://127.0.0.1:1/", sleeper)
    first = processes.start_service(service, tmp_path)
    me = plan.Service("supervisor", "supervisor", str(tmp_path), ["x"], pid=os.getpid(),
                      started=processes.process_start_ticks(os.getpid()))
    state.write_state(tmp_path, state.StackState({"replicas": 1}, [service], me))
    clock = FakeClock()
    watcher = supervisor.Supervisor(tmp_path, supervisor.Backoff(initial_s=1), say=lambda line: None, clock=clock)
    try:
        first.kill()
        first.wait()
        assert watcher.tick()
        clock.now += 1
        assert watcher.tick()                                   # restarted, under sigterm_deferred()
        [again] = watcher.children.values()
        assert again.pid == state.read_state(tmp_path).services[0].pid
        assert signal.SIGTERM not in blocked_signals(again.pid)
        again.terminate()                                       # what `down` sends first
        assert again.wait(30) == -signal.SIGTERM
    finally:
        for proc in [first, *watcher.children.values()]:
            proc.kill()
            proc.wait()


def test_a_sigterm_during_the_deferred_block_arrives_once_it_ends():
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        with supervisor.sigterm_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert received == []
            assert signal.SIGTERM not in blocked_signals(os.getpid())   # nothing for a child to inherit
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
