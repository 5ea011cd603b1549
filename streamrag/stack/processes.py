"""Processes of the local stack: start one in its own session, tell whether it still runs, stop
them in order, and `Launch`, which starts services (all of a planned stack, or only those that
are down), waits for each one's health and starts the supervisor.

A pid is only ever signalled while its `/proc` start time still matches the recorded one, so
a reused pid is never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from servicekit.health import check_health
from servicekit.pids import process_start_ticks
from streamrag.stack.plan import HOST, Service, StackError, probe_timeout
from streamrag.stack.state import StackState, clear_state, log_path, write_state
from streamrag.stack.tls import stack_client_tls


def is_running(service: Service) -> bool:
    """True while the process `up` started is still alive (a reused pid does not count)."""
    if service.pid is None or service.started is None:
        return False
    return process_start_ticks(service.pid) == service.started


def port_in_use(port: int) -> bool:
    """True when something listens on `port` (or holds it bound without letting it be shared).

    The bind sets SO_REUSEADDR, as gRPC, Redis, uvicorn and the metrics server do when they bind:
    the sockets of closed connections (TIME_WAIT, which a stack that served requests leaves for a
    minute after `down`) do not keep them from binding, so they do not count as busy here either.
    SO_REUSEPORT, which gRPC sets too, is left off: with it the bind would succeed beside a live
    gRPC server and share its port.
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    env.setdefault("RUST_LOG", "warn")        # DiskANN logs every search otherwise
    return env


def start_service(service: Service, run_dir: Path, note: str | None = None) -> subprocess.Popen:
    """Start one service in its own session (Ctrl-C on `up` does not reach it), output to its log.

    Without `note` the log starts over; with one (a restart), the note is appended to the log and
    the new output after it, so the lines before a crash stay there.
    """
    log = log_path(run_dir, service.name)
    log.parent.mkdir(exist_ok=True)
    with open(log, "ab" if note else "wb") as out:
        if note:
            out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} {note} ---\n".encode())
            out.flush()
        proc = subprocess.Popen(service.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=run_dir, env=child_env(), start_new_session=True)
    service.pid, service.started = proc.pid, process_start_ticks(proc.pid)
    (run_dir / f"{service.name}.pid").write_text(f"{proc.pid}\n")
    return proc


def stop_services(services: list[Service], timeout_s: float) -> list[str]:
    """SIGTERM every running one, wait up to `timeout_s`, SIGKILL the rest; returns the names killed."""
    def signal_all(group: list[Service], sig: signal.Signals) -> None:
        for s in group:
            if is_running(s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(s.pid, sig)

    def wait_gone(group: list[Service], seconds: float) -> list[Service]:
        deadline = time.monotonic() + seconds
        while (left := [s for s in group if is_running(s)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    signal_all(services, signal.SIGTERM)
    stubborn = wait_gone(services, timeout_s)
    signal_all(stubborn, signal.SIGKILL)
    wait_gone(stubborn, 5.0)
    return [s.name for s in stubborn]


def stop_in_order(services: list[Service], timeout_s: float) -> list[str]:
    """The orchestrator first (no new work), then the workers, then Redis (the store's last flush)."""
    ours = [s for s in services if s.argv]
    waves = [[s for s in ours if s.kind == "orchestrator"],
             [s for s in ours if s.kind not in ("orchestrator", "redis")],
             [s for s in ours if s.kind == "redis"]]
    return [name for wave in waves for name in stop_services(wave, timeout_s)]


def supervisor_service(run_dir: Path) -> Service:
    """The supervisor as a process `start_service` can start (it is not one of the stack's services)."""
    return Service("supervisor", "supervisor", str(run_dir),
                   [sys.executable, "-m", "streamrag.stack.supervisor", str(run_dir)])


class Launch:
    """One `up` (or a restart): starts services, waits for their health, stops them all if one fails."""

    def __init__(self, run_dir: Path, state: StackState, timeout_s: float) -> None:
        self.run_dir, self.state = run_dir, state
        self.options, self.services = state.options, state.services
        self.by_name = {s.name: s for s in self.services}
        self.procs: dict[str, subprocess.Popen] = {}
        self.healthy: set[str] = set()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout_s
        self.timeout_s = timeout_s

    def start(self, service: Service, note: str | None = None) -> None:
        for need in service.needs:
            self.wait_healthy(self.by_name[need])
        if service.argv:
            print(f"  starting {service.name:<13} {service.target}", flush=True)
            self.procs[service.name] = start_service(service, self.run_dir, note)
            write_state(self.run_dir, self.state)

    def start_supervisor(self) -> None:
        """Start the supervisor unless one runs; from now on a service that dies is started again."""
        if self.state.supervisor is not None and is_running(self.state.supervisor):
            return
        supervisor = supervisor_service(self.run_dir)
        start_service(supervisor, self.run_dir, note="supervisor started")
        self.state.supervisor = supervisor
        write_state(self.run_dir, self.state)

    def wait_healthy(self, service: Service) -> None:
        timeout_s = probe_timeout(service, self.options, 2.0)
        while service.name not in self.healthy:
            proc = self.procs.get(service.name)
            if proc is not None and proc.poll() is not None:
                raise StackError(service.name, f"exited with code {proc.returncode} before it was healthy",
                                 log_path(self.run_dir, service.name))
            reason = check_health(service.check, service.target, timeout_s, stack_client_tls(self.options))
            if reason is None:
                self.healthy.add(service.name)
                print(f"  {service.name:<22} healthy after {time.monotonic() - self.t0:.1f} s", flush=True)
            elif time.monotonic() > self.deadline:
                raise StackError(service.name, f"not healthy after {self.timeout_s:.0f} s (last check: {reason})",
                                 log_path(self.run_dir, service.name) if service.argv else None)
            else:
                time.sleep(0.25)

    def abort(self) -> None:
        print("stopping the services already started", file=sys.stderr, flush=True)
        stop_in_order(self.services, timeout_s=10.0)
        for proc in self.procs.values():       # reap our children
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        clear_state(self.run_dir, self.services)
