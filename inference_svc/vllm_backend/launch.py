"""Starting a vLLM-backed Inference service: in-process for `streamrag serve inference --backend vllm`,
or as a subprocess for benchmarks and tests (`start_vllm_service`).

    from inference_svc.vllm_backend.launch import start_vllm_service
    service = start_vllm_service(model_dir, port=0, max_streams=64)   # waits until it serves
    channel = grpc.insecure_channel(service.address)                   # Generate = vLLM-NS, StreamPrompt = vLLM-S
    ...
    service.stop()

The subprocess keeps vllm (and its engine-core process) out of the caller's interpreter; it
needs an interpreter where the vllm extra is installed (`python=`, default this one).
"""

from __future__ import annotations

import argparse
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

from servicekit.config import ServiceConfig

REPO = Path(__file__).resolve().parents[2]
READY = re.compile(r"inference service on ([^\s:]+):(\d+) \(metrics :(\d+|None)\)")


def build_vllm_service(args: argparse.Namespace, model_dir: Path, config: ServiceConfig):
    """The service for parsed `streamrag serve inference --backend vllm` flags (imports vllm)."""
    from inference_svc.server import policy_options
    from inference_svc.vllm_backend.config import UnsupportedConfiguration, VllmSpec, vllm_available

    if not vllm_available():
        raise SystemExit("error: --backend vllm needs vllm in this Python: see docs/vllm.md "
                         "(python3.11 -m inference_svc.vllm_backend.install /opt/vllm-venv)")
    from inference_svc.vllm_backend.service import VllmInferenceService

    try:
        spec = VllmSpec(model_dir=model_dir, device=args.device, dtype=args.dtype, policy=args.policy,
                        block_size=args.block_size, kv_device_bytes=args.kv_device_bytes,
                        kv_device_blocks=args.kv_device_blocks, token_budget=args.token_budget,
                        max_running=args.max_running, eviction=args.eviction or "recompute",
                        policy_options=tuple(policy_options(args).items()))
    except UnsupportedConfiguration as exc:
        raise SystemExit(f"error: {exc}") from None
    return VllmInferenceService(spec, config, args.max_streams)


@dataclass
class VllmServiceHandle:
    """A running `streamrag serve inference --backend vllm` process."""

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

    def __enter__(self) -> VllmServiceHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_vllm_service(model_dir: Path | str | None = None, port: int = 0, max_streams: int = 256, *,
                       policy: str = "fcfs", dtype: str = "bfloat16", device: str = "cpu",
                       extra_args: list[str] | tuple[str, ...] = (), metrics_port: int = 0,
                       python: str | None = None, env: dict[str, str] | None = None,
                       log_path: Path | None = None, timeout_s: float = 600.0) -> VllmServiceHandle:
    """Start the service as a subprocess and wait until it serves; raises RuntimeError with the
    log's tail if it exits or does not come up within `timeout_s`. `port=0` picks a free port.
    vLLM's own output goes to `log_path` (default: a temporary file, see `.log_path`). `python`: an
    interpreter with vllm installed (default: $STREAMRAG_VLLM_PYTHON, else this one)."""
    python = python or os.environ.get("STREAMRAG_VLLM_PYTHON") or sys.executable
    command = [python, "-m", "streamrag.cli", "serve", "inference", "--backend", "vllm",
               "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
               "--max-streams", str(max_streams), "--policy", policy, "--dtype", dtype, "--device", device,
               *(["--model", str(model_dir)] if model_dir is not None else []), *extra_args]
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="streamrag-vllm-", suffix=".log")
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
        raise RuntimeError(f"the vLLM inference service did not start ({log_path}):\n{_tail(log_path)}")
    drain = threading.Thread(target=_drain, args=(process.stdout, log), name="vllm-service-log", daemon=True)
    drain.start()
    host, port_text, metrics_text = match.groups()
    return VllmServiceHandle(process, host, int(port_text), None if metrics_text == "None" else int(metrics_text),
                             log_path, drain)


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
