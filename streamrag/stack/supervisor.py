"""The local stack's supervisor: a service of `streamrag up` that dies is started again, like
compose's `restart: unless-stopped`, with a back-off.

`up` starts it once every service is healthy (`python -m streamrag.stack.supervisor RUN_DIR`,
in its own session); state.json records it under "supervisor", and it logs to
logs/supervisor.log. Every `POLL_S` it reads state.json. A service whose process is gone
(crashed, killed, exited) is started again with the same command, after a delay that doubles
with each crash in a row (1, 2, 4 ... 30 s) and starts over once the service has run
`reset_after_s`. Each restart is recorded in state.json (`restarts`, `last_exit`), and
`streamrag status` shows it. Health is not its business: a service that runs but does not
answer is left alone (compose does the same).

Restarts happen under the run directory's lock, after reading state.json again, so `up`,
`down` and deliberate restarts (`commands.restart`) never race it; `down` stops it first. It
exits when state.json is gone or names another supervisor.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from streamrag.stack.processes import is_running, start_service
from streamrag.stack.state import StackState, locked, read_state, write_state

POLL_S = 0.5


@dataclass(frozen=True)
class Backoff:
    """How long to wait before starting a dead service again."""

    initial_s: float = 1.0
    max_s: float = 30.0
    reset_after_s: float = 60.0          # a service that ran this long starts over at `initial_s`

    def delay(self, crashes_in_a_row: int) -> float:
        return min(self.max_s, self.initial_s * 2 ** max(0, crashes_in_a_row - 1))


def say_with_time(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}", flush=True)


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """SIGTERM waits until the block ends, so a process started here is always recorded.

    A handler notes the signal and it is raised again once the block ends. Not the signal mask: a
    child inherits the mask through exec, so a service started here would keep SIGTERM blocked for
    good (and `down` would have to SIGKILL it), while a handler is reset to the default at exec.
    Main thread only (`signal.signal`), as the supervisor runs.
    """
    caught: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if caught:
            signal.raise_signal(signal.SIGTERM)


class Supervisor:
    """Watches one run directory's services and starts again those that die."""

    def __init__(self, run_dir: Path, backoff: Backoff = Backoff(), say: Callable[[str], None] = say_with_time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.backoff, self.say, self.clock = run_dir, backoff, say, clock
        self.children: dict[int, subprocess.Popen] = {}     # what we started, to reap it and read its exit code
        self.in_a_row: dict[str, int] = {}                    # crashes in a row, per service
        self.since: dict[str, float] = {}                     # when we last saw it start (or began watching)
        self.due: dict[str, tuple[float, str]] = {}           # service -> (restart at, how it ended)

    @staticmethod
    def is_mine(state: StackState | None) -> bool:
        supervisor = state.supervisor if state else None
        return supervisor is not None and supervisor.pid == os.getpid() and is_running(supervisor)

    def how_it_ended(self, pid: int | None) -> str:
        proc = self.children.pop(pid, None) if pid is not None else None
        if proc is None or proc.poll() is None:
            return f"process {pid} is gone"
        if proc.returncode < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-proc.returncode).name}"
        return f"exited with code {proc.returncode}"

    def tick(self) -> bool:
        """One look at the stack, restarting what is due; False when the supervisor should exit."""
        state = read_state(self.run_dir)
        if not self.is_mine(state):
            return False
        for proc in self.children.values():
            proc.poll()                                        # reap: a zombie does not count as running
        now = self.clock()
        for service in state.services:
            if not service.argv:
                continue
            self.since.setdefault(service.name, now)
            if is_running(service):
                self.due.pop(service.name, None)
                if now - self.since[service.name] >= self.backoff.reset_after_s:
                    self.in_a_row[service.name] = 0
                continue
            if service.name not in self.due:
                delay = self.backoff.delay(self.in_a_row.get(service.name, 0) + 1)
                ended = self.how_it_ended(service.pid)
                self.due[service.name] = (now + delay, ended)
                self.say(f"{service.name} (pid {service.pid}) {ended}: starting it again in {delay:g} s")
        ready = [name for name, (at, _) in self.due.items() if at <= now]
        return self.restart(ready) if ready else True

    def restart(self, names: list[str]) -> bool:
        """Start the named services again, unless someone else did meanwhile; False when no longer ours."""
        with locked(self.run_dir), sigterm_deferred():
            state = read_state(self.run_dir)
            if not self.is_mine(state):
                return False
            now = self.clock()
            for service in state.services:
                if service.name not in names:
                    continue
                _, ended = self.due.pop(service.name)
                if is_running(service):                        # `up` or a deliberate restart was first
                    continue
                proc = start_service(service, self.run_dir, note=f"restarted by the supervisor ({ended})")
                self.children[proc.pid] = proc
                service.restarts += 1
                service.last_exit = ended
                self.in_a_row[service.name] = self.in_a_row.get(service.name, 0) + 1
                self.since[service.name] = now
                self.say(f"{service.name} started again: pid {proc.pid}, restart {service.restarts}")
            write_state(self.run_dir, state)
        return True

    def run(self) -> None:
        with locked(self.run_dir):       # whoever started us records us in state.json before letting go
            pass
        self.say(f"supervising the stack in {self.run_dir}")
        while self.tick():
            time.sleep(POLL_S)
        self.say("the stack is gone or has another supervisor: exiting")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m streamrag.stack.supervisor RUN_DIR", file=sys.stderr)
        return 2
    Supervisor(Path(argv[0]).resolve()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
