"""`python -m retriever_svc.server --kind anns ...` as a child process, for tests that kill it."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


class RetrieverProcess:
    """An ANNS retriever on a free port (its flags: `args`); stdout is drained by a thread, stderr goes to `log`."""

    def __init__(self, log: Path, *args: str) -> None:
        self.log = log
        with open(log, "ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "retriever_svc.server", "--kind", "anns", *args,
                 "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0"],
                cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for_port(self, timeout_s: float = 180) -> int:
        while True:
            try:
                line = self._lines.get(timeout=timeout_s)
            except queue.Empty:
                pytest.fail(f"the retriever did not start in {timeout_s} s: {self.log.read_text()[-2000:]}")
            if line is None:
                pytest.fail(f"the retriever exited ({self.process.wait()}): {self.log.read_text()[-2000:]}")
            if found := re.search(r"anns retriever on \S+:(\d+) ", line):
                return int(found[1])

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
