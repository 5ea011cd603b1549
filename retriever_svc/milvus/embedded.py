"""The embedded Milvus server (the `milvus` package, 2.3.5: Milvus Standalone in one process, local storage).

    python -m retriever_svc.milvus.embedded --data DIR [--port 19530]

runs it in the foreground until SIGTERM/SIGINT, then stops it gracefully (a killed server
leaves state that can make the next start on the same folder fail with "node not match").
`EmbeddedMilvus` does the same from Python (tests, `bench retrieval`). Its index type is
HNSW: this build has no DiskANN (see `connection`).
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

SERVER_STOP_TIMEOUT_S = 10
STOP_GRACE_S = 30.0
INSTALL_HINT = "the embedded Milvus server needs the milvus extra: pip install -e '.[milvus]'"


class EmbeddedMilvus:
    """One embedded server on `port` with its data under `data_dir`."""

    def __init__(self, data_dir: Path, port: int = 19530, health_port: int | None = None) -> None:
        try:
            from milvus import MilvusServer
        except ImportError:
            raise SystemExit(f"error: {INSTALL_HINT}") from None
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = MilvusServer()
        self._server.set_base_dir(str(self.data_dir))
        # The proxy's port is exact (a restart must come back where its clients connect); the others are the next
        # free ones. Probes set SO_REUSEADDR as Milvus's own listeners do, so a port a killed server left in
        # TIME_WAIT counts as free (without it a restart moved to the next port).
        self._server.config.configs["proxy_port"] = port
        self._server.config.try_bind_port = _bind_reusing
        if health_port is not None:            # /healthz and metrics (the next free port from 9091 otherwise)
            self._server.webservice_port = health_port
        self._server.config.set("log.level", "warn")
        # Its graceful stop waits up to 30 minutes by default; past this it quits on its own.
        self._server.config.set("common.gracefulStopTimeout", SERVER_STOP_TIMEOUT_S)

    @property
    def port(self) -> int:
        return int(self._server.config.get("proxy_port"))

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._server.server_proc.pid if self._server.server_proc else None

    def start(self) -> EmbeddedMilvus:
        """Start and wait until it answers (about 11-20 s)."""
        self._server.start()
        return self

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, wait for a clean exit; SIGKILL only past `grace_s`."""
        process: subprocess.Popen | None = self._server.server_proc
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            self._server.server_proc = None
        self._server.stop()

    def kill(self) -> None:
        """SIGKILL (fault tests)."""
        process = self._server.server_proc
        if process is not None:
            process.kill()
            process.wait()
            self._server.server_proc = None
        self._server.stop()


def _bind_reusing(port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        return sock
    except OSError:
        sock.close()
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retriever_svc.milvus.embedded", allow_abbrev=False,
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="data folder (kept between runs)")
    parser.add_argument("--port", type=int, default=19530, help="the proxy's port (taken: the server fails)")
    parser.add_argument("--health-port", type=int, default=None,
                        help="its /healthz port; given, both ports are exact: taken, the server stops with an error "
                             "(default: 9091 or the next free one)")
    args = parser.parse_args(argv)
    server = EmbeddedMilvus(args.data, args.port, args.health_port).start()
    moved = server.port != args.port or server._server.webservice_port != args.health_port
    if args.health_port is not None and moved:
        server.stop()
        print(f"error: port {args.port} or {args.health_port} is taken", file=sys.stderr, flush=True)
        return 1
    print(f"embedded Milvus on {server.uri} (data {args.data})", flush=True)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    while not stopping.wait(1.0):
        if server._server.server_proc is None or server._server.server_proc.poll() is not None:
            print("embedded Milvus exited", file=sys.stderr, flush=True)
            return 1
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
