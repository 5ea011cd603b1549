"""A gate in front of an inference replica: a real `Inference` (and `Sessions`) gRPC server on
loopback that forwards every call to the replica, and can hold one answer (a `Generate`, a
`StreamPrompt` or a session `Query`) after a given number of tokens.

It stands where a replica's network front is, so a test can stop an answer at an exact point
(`arm(tokens)`: the next call that gets that far waits before its next token) without timing,
then do something to the orchestrator or the replica (kill it), and let the answer go on
(`release()`). Only the first call that reaches the point is held; later calls pass. `stop()`
ends the gate like a replica that died: its calls end, its port closes. `calls` lists the Sessions
calls that came through, with their metadata (the tenant an orchestrator named, ...).
"""

from __future__ import annotations

import asyncio
import threading

import grpc

from protos import inference_pb2, inference_pb2_grpc, sessions_pb2, sessions_pb2_grpc
from servicekit.config import ServiceConfig
from servicekit.server import ServiceRunner
from tests.support.serving import LoopThread, wait_serving

INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
SESSIONS = sessions_pb2.DESCRIPTOR.services_by_name["Sessions"].full_name


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


class _ForwardSessions(sessions_pb2_grpc.SessionsServicer):
    """Every Sessions call forwarded as it is; a Query through the gate's hold."""

    def __init__(self, gate: InferenceGate) -> None:
        self.gate = gate

    async def _unary(self, name: str, request, context):
        self.gate.note(name, context)
        try:
            return await getattr(self.gate.sessions, name)(request, timeout=120)
        except grpc.RpcError as exc:
            await context.abort(exc.code(), exc.details() or "")

    async def CreateSession(self, request, context):
        return await self._unary("CreateSession", request, context)

    async def Ingest(self, request_iterator, context):
        return await self._unary("Ingest", iter([message async for message in request_iterator]), context)

    async def RegisterFlashQuery(self, request, context):
        return await self._unary("RegisterFlashQuery", request, context)

    async def UnregisterFlashQuery(self, request, context):
        return await self._unary("UnregisterFlashQuery", request, context)

    async def DescribeSession(self, request, context):
        return await self._unary("DescribeSession", request, context)

    async def ListSessions(self, request, context):
        return await self._unary("ListSessions", request, context)

    async def CloseSession(self, request, context):
        return await self._unary("CloseSession", request, context)

    async def Query(self, request, context):
        self.gate.note("Query", context)
        async for response in self.gate.relay(self.gate.sessions.Query(request), context):
            yield response

    async def Subscribe(self, request, context):
        async for response in self.gate.relay(self.gate.sessions.Subscribe(request), context):
            yield response


def _is_token(response) -> bool:
    """A token of a session query (`token`) or of an Inference answer (`event.token`)."""
    if isinstance(response, sessions_pb2.QueryResponse):
        return response.WhichOneof("kind") == "token"
    return isinstance(response, inference_pb2.GenerateResponse | inference_pb2.StreamPromptResponse) and \
        response.event.WhichOneof("kind") == "token"


class InferenceGate:
    """`InferenceGate(replica_address)`; `.address` is where orchestrators dial it."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.hold_at: int | None = None
        self.held = threading.Event()           # set once a call is held
        self.held_peer = ""                     # the held call's caller ("ipv4:127.0.0.1:PORT")
        self.calls: list[tuple[str, dict[str, str]]] = []   # each Sessions call: its name and metadata
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
        self.sessions = sessions_pb2_grpc.SessionsStub(self.channel)
        self._release = asyncio.Event()
        self.runner = ServiceRunner(ServiceConfig("inference", port=0, metrics_port=None, grace_s=0),
                                    [(inference_pb2_grpc.add_InferenceServicer_to_server, _Forward(self)),
                                     (sessions_pb2_grpc.add_SessionsServicer_to_server, _ForwardSessions(self))],
                                    [INFERENCE, SESSIONS])
        return await self.runner.start(handle_signals=False)

    def note(self, name: str, context) -> None:
        self.calls.append((name, {key: value for key, value in context.invocation_metadata() or ()
                                  if isinstance(value, str)}))

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
                if _is_token(response):
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
