"""One `StreamPrompt` call to a replica, and every message sent on it, so that a move to another
replica before the first token replays the prompt so far (keeper.py decides the move; relay.py writes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from protos import common_pb2, inference_pb2

log = logging.getLogger(__name__)


class InferenceSession:
    """The StreamPrompt call to one replica, and everything sent so far (to replay on a retry).

    A write to a call that has failed is not an error here: the reader sees the failure and
    either moves the session to another replica (replaying every message, this one included)
    or reports it. A lock keeps a replay and new writes in order.
    """

    def __init__(self, stub, request_id: str, sampling: common_pb2.SamplingParams, metadata=()) -> None:
        self.request_id = request_id
        self.sampling = sampling
        self.sent: list[inference_pb2.StreamPromptRequest] = []
        self.closed = False                      # done_writing was called
        self.call = stub.StreamPrompt(metadata=metadata)   # a decode replica to hand off to (pairing.py)
        self._lock = asyncio.Lock()

    async def send(self, update: inference_pb2.PromptUpdate) -> None:
        message = inference_pb2.StreamPromptRequest(update=update)
        async with self._lock:
            self.sent.append(message)
            await self._write(message)

    async def close(self) -> None:
        async with self._lock:
            self.closed = True
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self.call.done_writing()

    async def _write(self, message: inference_pb2.StreamPromptRequest) -> None:
        try:
            await self.call.write(message)
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            log.debug("%s: write to a failed call (%s); the reader decides", self.request_id, exc)

    async def reopen(self, stub) -> None:
        """Move to another replica and send it the whole prompt so far."""
        async with self._lock:
            self.call.cancel()
            self.call = stub.StreamPrompt()
            for message in self.sent:
                await self._write(message)
            if self.closed:
                with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                    await self.call.done_writing()
