"""What every service runner in tests/support/ shares: the one readiness rule, and the two ways a
runner hosts a service.

- Readiness: a service is ready when its health says SERVING (gRPC health; the gateway, which has no
  gRPC, when `GET /health` answers 200). `wait_serving` is the only wait; no runner reads log lines.
- In-process: the service's own server object on a `LoopThread` (an event loop in a thread: a grpc.aio
  server belongs to the loop it was built in). Fast, and a test can reach into the service.
- Subprocess: a `ChildProcess` running the service's real command line on a port chosen beforehand,
  so it can be killed (SIGKILL), frozen (SIGSTOP) and started again on the same port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from servicekit.health import check_health
from servicekit.tls import TlsFiles

ROOT = Path(__file__).resolve().parents[2]


def wait_serving(target: str, *, check: str = "grpc", process: subprocess.Popen | None = None,
                 tls: TlsFiles | None = None, timeout_s: float = 300.0, what: str = "",
                 log: Path | None = None) -> None:
    """Return once `target` (host:port, or the gateway's http(s)://.../health URL) is SERVING; raise
    RuntimeError (with the log's tail) if `process` exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while (why := check_health(check, target, timeout_s=2.0, tls=tls)) is not None:
        exited = process is not None and process.poll() is not None
        if exited or time.monotonic() > deadline:
            how = f"exited with {process.returncode}" if exited else f"not SERVING in {timeout_s:.0f} s ({why})"
            tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log and log.exists() else ""
            raise RuntimeError(f"{what or target}: {how}{tail}")
        time.sleep(0.05)


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` runs a coroutine there and returns its result."""

    def __init__(self, name: str = "test-service") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro, timeout_s: float = 300.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def close(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)


class ChildProcess:
    """`argv` as a child process in its own session, output to `log`, started by `start()` and ready
    when `target` is SERVING. `kill()` SIGKILLs it, `signal(sig)` sends one, `stop()` ends it
    gracefully (SIGCONT first: a stopped process cannot take SIGTERM), and `start()` runs it again."""

    def __init__(self, argv: Sequence[str], target: str, log: Path, *, check: str = "grpc",
                 tls: TlsFiles | None = None, env: dict[str, str] | None = None, ready_s: float = 300.0,
                 what: str = "") -> None:
        self.argv = list(argv)
        self.target = target
        self.log = log
        self.check = check
        self.tls = tls
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **(env or {})}
        self.ready_s = ready_s
        self.what = what or Path(self.argv[2] if self.argv[1:2] == ["-m"] else self.argv[0]).name
        self.process: subprocess.Popen | None = None

    def launch(self) -> None:
        """Start it without waiting (a test that kills it before it serves)."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    def start(self) -> None:
        """Start it and wait until it is SERVING."""
        self.launch()
        try:
            wait_serving(self.target, check=self.check, process=self.process, tls=self.tls, timeout_s=self.ready_s,
                         what=self.what, log=self.log)
        except BaseException:
            self.kill()
            raise

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its callers; reaped."""
        if self.running:
            self.process.kill()
        if self.process is not None:
            self.process.wait(30)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.running:
            self.signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        return None if self.process is None else self.process.returncode


def python_module(module: str, *args: str) -> list[str]:
    """The argv that runs `python -m module args` with this interpreter."""
    return [sys.executable, "-m", module, *args]
