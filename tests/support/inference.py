"""The inference runner: a replica in this process (`RunningInference`) or as its own process
(`InferenceProcess`, through `inference_svc/launch.py`), both ready when their gRPC health says
SERVING and both with the same client surface (`address`, `stub`, `stats()`,
`wait_until_all_blocks_free()`), so a test written against one runs against the other.

    replica = RunningInference(model_dir, kv_device_blocks=128, token_budget=256)        # native, fp32
    pair = RunningInference(model_dir, role="prefill")                                   # disaggregation
    process = InferenceProcess(model_dir, extra_args=["--kv-device-blocks", "128"])     # kill(), start()
    vllm = InferenceProcess(model_dir, backend="vllm")                                   # $STREAMRAG_VLLM_PYTHON
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc

from inference_svc.engine.engine import EngineConfig
from inference_svc.engine.factory import EngineSpec
from inference_svc.launch import ServiceHandle, start_inference_service, start_vllm_service
from protos import inference_pb2, inference_pb2_grpc
from servicekit.config import ServiceConfig
from servicekit.tls import TlsFiles
from tests.support.redis_server import free_port
from tests.support.serving import LoopThread, wait_serving


class InferenceClient:
    """What a test calls on a replica, however it runs: `stub`, `stats()`, `wait_until_all_blocks_free()`."""

    address: str
    channel: grpc.Channel
    stub: inference_pb2_grpc.InferenceStub

    def _dial(self, tls: TlsFiles | None = None) -> None:
        self.channel = (grpc.secure_channel(self.address, tls.channel_credentials()) if tls is not None
                        else grpc.insecure_channel(self.address))
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)

    def stats(self) -> inference_pb2.EngineStats:
        return self.stub.GetStats(inference_pb2.GetStatsRequest(), timeout=30).stats

    def wait_until_all_blocks_free(self, timeout_s: float = 60.0) -> inference_pb2.EngineStats:
        """Blocks of aborted requests are freed at the engine's next step: poll until they are."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if all(p.free_blocks == p.total_blocks for p in stats.pools) and stats.num_active == 0:
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"blocks still in use: {stats}")
            time.sleep(0.05)


class RunningInference(InferenceClient):
    """The native service in this process, on a free loopback port. `role` (prefill, decode, both)
    serves `KvTransfer` too, as `streamrag serve inference` does; None: the plain native service.
    `tls`: the port serves (mutual) TLS with these files; the test's channel presents `client_tls`
    (default: the same files). `host`/`port`: where it listens (another loopback address, a port
    chosen by the test). `**engine`: `EngineConfig` fields."""

    def __init__(self, model_dir: Path, *, role: str | None = None, max_streams: int = 64, kv_device_blocks: int = 512,
                 kv_cpu_blocks: int = 512, dtype: str = "float32", tls: TlsFiles | None = None,
                 client_tls: TlsFiles | None = None, host: str = "127.0.0.1", port: int = 0,
                 **engine: object) -> None:
        self.spec = EngineSpec(model_dir=model_dir, dtype=dtype, kv_device_blocks=kv_device_blocks,
                               kv_cpu_blocks=kv_cpu_blocks, engine=EngineConfig(**engine))
        self.role, self.max_streams, self.tls, self.bind = role, max_streams, tls, (host, port)
        self.host = LoopThread("inference-test-server")
        self.thread = self.host.thread
        self.port = self.host.run(self._start())
        self.address = f"{host}:{self.port}"
        client_tls = client_tls or tls
        wait_serving(self.address, tls=client_tls, what="inference replica")
        self._dial(client_tls)

    async def _start(self) -> int:
        config = ServiceConfig("inference", host=self.bind[0], port=self.bind[1], metrics_port=0)
        if self.role is None:
            from inference_svc.native.service import NativeInferenceService

            self.service = NativeInferenceService(self.spec, config, self.max_streams)
        else:
            from inference_svc.disagg.service import DisaggInferenceService

            self.service = DisaggInferenceService(self.spec, config, self.max_streams, role=self.role)
            self.service.runner.tls = self.tls         # as `streamrag serve inference --tls-*` sets it
        return await self.service.start(handle_signals=False)

    def run(self, coro, timeout_s: float = 60):
        """Run a coroutine on the service's loop (its server and engine thread live there)."""
        return self.host.run(coro, timeout_s)

    def stop(self) -> None:
        """Stop serving (a replica that goes away); a second call does nothing."""
        if self.host.alive:
            self.channel.close()
            self.host.run(self.service.stop(0), 30)
            self.host.close()


class InferenceProcess(InferenceClient):
    """`streamrag serve inference --backend BACKEND` as its own process (inference_svc/launch.py) on a
    port of its own, fixed for its life: `kill()` (SIGKILL) or `signal(SIGSTOP)` it and `start()` it
    again on the same port. `backend="vllm"` runs under $STREAMRAG_VLLM_PYTHON."""

    def __init__(self, model_dir: Path, *, backend: str = "native", port: int | None = None, max_streams: int = 64,
                 dtype: str = "float32", policy: str | None = "fcfs", extra_args: list[str] | tuple[str, ...] = (),
                 client_tls: TlsFiles | None = None, ready_s: float = 600.0) -> None:
        self.model_dir, self.backend, self.ready_s = model_dir, backend, ready_s
        self.options = dict(max_streams=max_streams, dtype=dtype, policy=policy, extra_args=tuple(extra_args),
                            metrics_port=0)
        self.client_tls = client_tls
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.handle: ServiceHandle | None = None
        self.start()
        self._dial(client_tls)

    def start(self) -> None:
        start = start_vllm_service if self.backend == "vllm" else start_inference_service
        backend = () if self.backend == "vllm" else (self.backend,)
        self.handle = start(*backend, self.model_dir, port=self.port, timeout_s=self.ready_s, **self.options)
        wait_serving(self.address, process=self.handle.process, tls=self.client_tls, what=f"{self.backend} replica",
                     log=self.handle.log_path)

    @property
    def process(self):
        return self.handle.process

    @property
    def log_path(self) -> Path:
        return self.handle.log_path

    def signal(self, sig: int) -> None:
        self.handle.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        self.handle.process.kill()
        self.handle.process.wait(30)

    def stop(self) -> int | None:
        """A graceful stop (SIGCONT first: a stopped process cannot take SIGTERM), which must end it
        cleanly (exit status 0) if it was running; its exit status."""
        if self.handle is None:
            return None
        running = self.handle.process.poll() is None
        if running:
            self.signal(signal.SIGCONT)
        if getattr(self, "channel", None) is not None:
            self.channel.close()
        status = self.handle.stop()
        assert not running or status == 0, f"the {self.backend} replica did not stop cleanly; log: {self.log_path}"
        return status
