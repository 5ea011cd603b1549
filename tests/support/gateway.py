"""A real gateway (uvicorn, the same config `streamrag serve gateway` builds) on a free loopback
port in its own thread, and the certificates `scripts/make_certs.sh` makes."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import uvicorn

from gateway.app import GatewaySettings, build_app
from gateway.server import uvicorn_config
from servicekit.tls import TlsFiles

ROOT = Path(__file__).resolve().parents[2]


class RunningGateway:
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
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        scheme = "https" if tls is not None and tls.serves else "http"
        self.base_url = f"{scheme}://127.0.0.1:{self.port}"
        self.ws_url = f"{'wss' if scheme == 'https' else 'ws'}://127.0.0.1:{self.port}/v1/realtime"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def make_certs(directory: Path) -> Path:
    """Run scripts/make_certs.sh into `directory` and return it."""
    subprocess.run(["bash", str(ROOT / "scripts" / "make_certs.sh"), str(directory)], check=True,
                   capture_output=True, timeout=120)
    return directory


def tls_files(certs: Path, name: str, *, ca: bool = True) -> TlsFiles:
    return TlsFiles(certs / f"{name}.crt", certs / f"{name}.key", certs / "ca.crt" if ca else None)
