"""The vLLM-backed Inference service in a subprocess (`start_vllm_service`), with the same surface
as `RunningInference` (`stub`, `address`, `stats()`, `wait_until_all_blocks_free()`), so the
black-box service tests run against it unchanged."""

from __future__ import annotations

from pathlib import Path

import grpc

from inference_svc.launch import start_vllm_service
from protos import inference_pb2_grpc
from tests.service.inference_harness import RunningInference


class RunningVllmInference(RunningInference):
    def __init__(self, model_dir: Path, *, max_streams: int = 64, dtype: str = "float32",
                 policy: str = "fcfs", extra_args: tuple[str, ...] = ()) -> None:
        self.max_streams = max_streams
        self.handle = start_vllm_service(model_dir, port=0, max_streams=max_streams, policy=policy, dtype=dtype,
                                         metrics_port=0, extra_args=extra_args)
        self.port = self.handle.port
        self.address = self.handle.address
        self.channel = grpc.insecure_channel(self.address)
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        assert self.handle.stop() == 0, f"the vLLM service did not stop cleanly; log: {self.handle.log_path}"
