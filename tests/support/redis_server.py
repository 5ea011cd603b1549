"""Start a private `redis-server` on a free loopback port, so tests never share state."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server child process with no persistence, bound to 127.0.0.1."""

    def __init__(self, workdir: Path, port: int | None = None, persist: bool = False,
                 extra_args: tuple[str, ...] = ()) -> None:
        """`port`: reuse a port (to restart a stopped server where clients expect it).
        `persist`: keep an append-only file in `workdir`, so a restart there keeps the data."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (bash scripts/setup.sh installs it)")
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "yes" if persist else "no", "--appendfsync", "always",
                      "--dir", str(workdir), "--daemonize", "no", "--loglevel", "warning", *extra_args]
        self._start()

    def _start(self) -> None:
        self._proc = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()

    def restart(self) -> None:
        """Start again on the same port and directory (after `stop`)."""
        self.stop()
        self._start()

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self._proc.stderr.read().decode(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        """SIGKILL, as a lost host would: no shutdown, no last write (start again with `restart`)."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stderr is not None:
            self._proc.stderr.close()
