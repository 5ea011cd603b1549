"""An orchestrator as its own process (`python -m orchestrator.server`), so a test can SIGKILL it
mid-answer; ready when its health says SERVING."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from servicekit.health import check_health
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]


class OrchestratorProcess:
    def __init__(self, redis_url: str, inference: list[str], *, anns: str = "", crawler: str = "", replay: str = "",
                 log_path: Path | None = None, ready_s: float = 120.0) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "orchestrator.server", "--port", str(self.port), "--metrics-port", "-1",
                "--grace", "0", "--redis", redis_url, "--anns", anns, "--crawler", crawler, "--replay", replay]
        for address in inference:
            argv += ["--inference", address]
        self._log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + ready_s
        while (why := check_health("grpc", self.address, timeout_s=1.0)) is not None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"orchestrator on {self.address} did not become healthy: {why}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its callers, its replicas or Redis."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
