"""The gateway runner: the real gateway (uvicorn, the same config `streamrag serve gateway` builds) in
this process (`RunningGateway`) or as its own process (`GatewayProcess`), on a free loopback port,
ready when `GET /health` answers 200 (the gateway has no gRPC health); and the certificates
`scripts/make_certs.sh` makes."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import uvicorn

from gateway.app import GatewaySettings, build_app
from gateway.server import uvicorn_config
from servicekit.tls import TlsFiles
from tests.support.redis_server import free_port
from tests.support.serving import ROOT, ChildProcess, wait_serving


def _urls(port: int, https: bool) -> tuple[str, str]:
    scheme = "https" if https else "http"
    return f"{scheme}://127.0.0.1:{port}", f"{'wss' if https else 'ws'}://127.0.0.1:{port}/v1/realtime"


class RunningGateway:
    """In this process, in its own thread. `tls`: serve HTTPS with these files (its CA checks the health probe)."""

    def __init__(self, settings: GatewaySettings, tls: TlsFiles | None = None) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self.settings = settings
        self.app = build_app(settings)
        config = uvicorn_config(self.app, host="127.0.0.1", port=self.port, tls=tls,
                                max_message_bytes=settings.max_body_bytes, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [listener]},
                                       name="gateway-test-server", daemon=True)
        self.thread.start()
        self.base_url, self.ws_url = _urls(self.port, tls is not None and tls.serves)
        try:
            wait_serving(f"{self.base_url}/health", check="http", tls=tls, timeout_s=30, what="gateway")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


class GatewayProcess(ChildProcess):
    """`streamrag serve gateway --orchestrator ORCHESTRATOR ARGS` as its own process on a free port."""

    def __init__(self, orchestrator: str, log: Path, *args: str, tls: TlsFiles | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base_url, self.ws_url = _urls(self.port, tls is not None and tls.serves)
        super().__init__([sys.executable, "-m", "streamrag.cli", "serve", "gateway", "--host", "127.0.0.1",
                          "--port", str(self.port), "--orchestrator", orchestrator, *args],
                         f"{self.base_url}/health", log, check="http", tls=tls, env=env, what="gateway")
        self.start()


def make_certs(directory: Path) -> Path:
    """Run scripts/make_certs.sh into `directory` and return it."""
    subprocess.run(["bash", str(ROOT / "scripts" / "make_certs.sh"), str(directory)], check=True,
                   capture_output=True, timeout=120)
    return directory


def tls_files(certs: Path, name: str, *, ca: bool = True) -> TlsFiles:
    return TlsFiles(certs / f"{name}.crt", certs / f"{name}.key", certs / "ca.crt" if ca else None)
