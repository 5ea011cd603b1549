"""An Inference service as a subprocess, either backend (`streamrag serve inference --backend B`):
for benchmarks and tests, so that the service runs in its own process as it does in production
and never shares the client's interpreter: hosted in the client's process, some bursts of the
native service ran a quarter slower, with the client's event-loop thread busy beside the engine's
threads (docs/results.md, "Ours against vLLM").

    from inference_svc.launch import start_inference_service
    service = start_inference_service("native", model_dir, port=0, max_streams=64)   # waits until it serves
    channel = grpc.insecure_channel(service.address)
    ...
    service.stop()

`python`: the interpreter to run it (for `vllm`, one with the vllm extra installed).
`start_vllm_service(model_dir, ...)` is the same for vLLM (Generate = vLLM-NS, StreamPrompt =
vLLM-S), run by $STREAMRAG_VLLM_PYTHON when set: it keeps vllm (and its engine-core process) out
of the caller's interpreter.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from inference_svc.options import DEFAULT_MAX_STREAMS

REPO = Path(__file__).resolve().parents[1]
READY = re.compile(r"inference service on ([^\s:]+):(\d+) \(metrics :(\d+|None)\)")


@dataclass
class ServiceHandle:
    """A running `streamrag serve inference` process."""

    process: subprocess.Popen
    host: str
    port: int
    metrics_port: int | None
    log_path: Path
    _drain: threading.Thread | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (graceful: the engine core process is shut down too), then SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        if self._drain is not None:
            self._drain.join(5)
        return self.process.returncode

    def __enter__(self) -> ServiceHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_inference_service(backend: str, model_dir: Path | str | None = None, port: int = 0,
                            max_streams: int = DEFAULT_MAX_STREAMS, *, policy: str | None = "fcfs",
                            dtype: str = "bfloat16", device: str = "cpu", extra_args: list[str] | tuple[str, ...] = (),
                            metrics_port: int = 0, python: str | None = None, env: dict[str, str] | None = None,
                            log_path: Path | None = None, timeout_s: float = 600.0) -> ServiceHandle:
    """Start the service as a subprocess and wait until it serves; raises RuntimeError with the
    log's tail if it exits or does not come up within `timeout_s`. `port=0` picks a free port.
    Its output goes to `log_path` (default: a temporary file, see `.log_path`). `policy` None: the
    service's default. `python`: default this interpreter."""
    python = python or sys.executable
    command = [python, "-m", "streamrag.cli", "serve", "inference", "--backend", backend,
               "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
               "--max-streams", str(max_streams), *(["--policy", policy] if policy else []),
               "--dtype", dtype, "--device", device,
               *(["--model", str(model_dir)] if model_dir is not None else []), *extra_args]
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"streamrag-{backend}-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    log = open(log_path, "w")   # noqa: SIM115 - handed to the drain thread, closed there
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **(env or {})}, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    match = _wait_ready(process, log, deadline)
    if match is None:
        process.kill()
        process.wait(10)
        log.close()
        name = "vLLM" if backend == "vllm" else backend
        raise RuntimeError(f"the {name} inference service did not start ({log_path}):\n{_tail(log_path)}")
    drain = threading.Thread(target=_drain, args=(process.stdout, log), name=f"{backend}-service-log", daemon=True)
    drain.start()
    host, port_text, metrics_text = match.groups()
    return ServiceHandle(process, host, int(port_text), None if metrics_text == "None" else int(metrics_text),
                         log_path, drain)


def start_vllm_service(model_dir: Path | str | None = None, port: int = 0,
                       max_streams: int = DEFAULT_MAX_STREAMS, *, python: str | None = None,
                       **options) -> ServiceHandle:
    """`start_inference_service("vllm", ...)`; `python` defaults to $STREAMRAG_VLLM_PYTHON."""
    return start_inference_service("vllm", model_dir, port, max_streams,
                                   python=python or os.environ.get("STREAMRAG_VLLM_PYTHON"), **options)


def _wait_ready(process: subprocess.Popen, log: IO[str], deadline: float) -> re.Match | None:
    result: list[re.Match] = []

    def read() -> None:
        for line in process.stdout:
            log.write(line)
            log.flush()
            if match := READY.search(line):
                result.append(match)
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    return result[0] if result else None


def _drain(stream: IO[str], log: IO[str]) -> None:
    with log:
        for line in stream:
            log.write(line)
            log.flush()


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
