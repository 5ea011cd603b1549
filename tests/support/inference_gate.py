"""A gate in front of an inference replica: a real `Inference` gRPC server on loopback that
forwards every call to the replica, and can hold one answer after a given number of tokens.

It stands where a replica's network front is, so a test can stop an answer at an exact point
(`arm(tokens)`: the next call that gets that far waits before its next token) without timing,
then do something to the orchestrator or the replica (kill it), and let the answer go on
(`release()`). Only the first call that reaches the point is held; later calls pass. `stop()`
ends the gate like a replica that died: its calls end, its port closes.
"""

from __future__ import annotations

import asyncio
import threading

import grpc

from protos import inference_pb2, inference_pb2_grpc
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner
from tests.support.serving import LoopThread, wait_serving

INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name


class _Forward(inference_pb2_grpc.InferenceServicer):
    def __init__(self, gate: InferenceGate) -> None:
        self.gate = gate

    async def Describe(self, request, context):
        return await self.gate.stub.Describe(request, timeout=30)

    async def GetStats(self, request, context):
        return await self.gate.stub.GetStats(request, timeout=30)

    async def Generate(self, request, context):
        call = self.gate.stub.Generate(request)
        async for response in self.gate.relay(call, context):
            yield response

    async def StreamPrompt(self, request_iterator, context):
        call = self.gate.stub.StreamPrompt()

        async def pump():
            async for message in request_iterator:
                await call.write(message)
            await call.done_writing()

        pumping = asyncio.create_task(pump())
        try:
            async for response in self.gate.relay(call, context):
                yield response
        finally:
            pumping.cancel()


class InferenceGate:
    """`InferenceGate(replica_address)`; `.address` is where orchestrators dial it."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.hold_at: int | None = None
        self.held = threading.Event()           # set once a call is held
        self.held_peer = ""                     # the held call's caller ("ipv4:127.0.0.1:PORT")
        self.host = LoopThread("inference-gate")
        self.loop, self.thread = self.host.loop, self.host.thread
        self.port = self._run(self._start())
        self.address = f"127.0.0.1:{self.port}"
        wait_serving(self.address, what="inference gate")

    def _run(self, coro, timeout: float = 60):
        return self.host.run(coro, timeout)

    async def _start(self) -> int:
        self.channel = grpc.aio.insecure_channel(self.replica)
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)
        self._release = asyncio.Event()
        self.runner = ServiceRunner(ServiceConfig("inference", port=0, metrics_port=None, grace_s=0),
                                    [(inference_pb2_grpc.add_InferenceServicer_to_server, _Forward(self))],
                                    [INFERENCE])
        return await self.runner.start(handle_signals=False)

    def arm(self, tokens: int) -> None:
        """Hold the next call that has passed `tokens` tokens on, before its next one."""
        self.held.clear()
        self.hold_at = tokens
        self.loop.call_soon_threadsafe(self._release.clear)

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self._release.set)

    async def relay(self, call, context):
        tokens = 0
        try:
            async for response in call:
                if response.event.WhichOneof("kind") == "token":
                    if self.hold_at is not None and tokens == self.hold_at:
                        self.hold_at = None
                        self.held_peer = context.peer()
                        self.held.set()
                        await self._release.wait()
                    tokens += 1
                yield response
        except grpc.RpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        finally:
            call.cancel()

    def stop(self) -> None:
        if self.host.alive:
            self._run(self.runner.stop(0))
            self._run(self.channel.close())
            self.host.close()
