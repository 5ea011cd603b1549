"""Does hosting the native Inference service in the client's own interpreter cost throughput?
(docs/benchmarks.md, "Prefill under concurrency", round 2 on the AMX machine.)

The `bench concurrent` burst (16 x 1,150 random tokens, max_tokens 1, token budget 2,048, dtype
auto) against the native service started as a subprocess (`sub`) or in this process on its own
thread and event loop (`in`, as `bench replay`, `bench concurrent` and `bench sessions` hosted it until then;
`InProcessInference` below); one
warm-up burst, then three with 3 s idle gaps. Prints tokens/s and wall seconds per burst.

    PYTHONPATH=. flock /tmp/streamrag-cpu.lock .venv/bin/python docs/concurrent/hosting_check.py sub
    PYTHONPATH=. flock /tmp/streamrag-cpu.lock .venv/bin/python docs/concurrent/hosting_check.py in
"""
import asyncio
import random
import sys
import threading
from pathlib import Path
from typing import Any

import grpc

from load_tests.concurrent_bench import burst, random_prompt
from protos import inference_pb2, inference_pb2_grpc


async def run(addr: str, tag: str, n: int = 3, gap: float = 3.0) -> None:
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = inference_pb2_grpc.InferenceStub(ch)
        vocab = (await stub.Describe(inference_pb2.DescribeRequest(), timeout=60)).model_info.vocab_size
        rng = random.Random(tag)
        await burst(stub, [random_prompt(vocab, 1150, rng) for _ in range(16)], tag + "-warm")
        for i in range(n):
            await asyncio.sleep(gap)
            r = await burst(stub, [random_prompt(vocab, 1150, rng) for _ in range(16)], f"{tag}-{i}")
            print(tag, r["tokens_per_s"], r["wall_s"], flush=True)


def main(mode: str) -> None:
    from inference_svc.embedded_model import prepare_embedded_model

    model = prepare_embedded_model(progress=False)
    if mode == "sub":
        from inference_svc.launch import start_inference_service

        service = start_inference_service("native", model, policy=None, dtype="auto",
                                          extra_args=["--token-budget", "2048"])
    else:
        from inference_svc.engine.engine import EngineConfig
        from inference_svc.engine.factory import EngineSpec

        service = InProcessInference(EngineSpec(model_dir=Path(model), device="cpu", dtype="auto",
                                                engine=EngineConfig(token_budget=2048)), max_streams=256)
    try:
        asyncio.run(run(service.address, {"sub": "subprocess", "in": "inprocess"}[mode]))
    finally:
        service.stop()


class InProcessInference:
    """An `InferenceService` on a loopback port, on its own thread and event loop."""

    def __init__(self, spec: Any, max_streams: int) -> None:
        self.spec, self.max_streams = spec, max_streams
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-inference", daemon=True)
        self.thread.start()
        try:
            port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=600)
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise
        self.address = f"127.0.0.1:{port}"

    async def _start(self) -> int:
        from inference_svc.server import InferenceService
        from servicekit.config import ServiceConfig

        self.service = InferenceService(self.spec, ServiceConfig("inference", port=0, metrics_port=None),
                                        self.max_streams)
        return await self.service.start(handle_signals=False)

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.service.stop(0), self.loop).result(timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=60)


if __name__ == "__main__":
    main(sys.argv[1])
