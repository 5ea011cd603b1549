"""What an `Inference` servicer with hand-offs adds, the same on both backends (native
`servicer.DisaggServicer`, vLLM `vllm_backend/handoff.VllmDisaggServicer`): the decode replica a
StreamPrompt call names in its metadata (`wire.DECODE_TARGET_KEY`), which calls are handed off
there (`_open`), one channel per decode replica, and in `GetStats` this replica's role and the
transfers it decodes counted as its load.

A mixin, listed before the backend's servicer class, which writes `_hand_off`. Neither the native
engine nor vllm is imported here.
"""

from __future__ import annotations

import asyncio
import contextvars

from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.wire import DECODE_TARGET_KEY
from protos import kv_transfer_pb2_grpc
from servicekit.channels import open_channel

# The decode replica the running StreamPrompt call asked for ("" = none). Each gRPC call runs in
# its own task, so the value set at the start of a call is the one its `_open` sees.
_DECODE_TARGET: contextvars.ContextVar[str] = contextvars.ContextVar("decode_target", default="")


class DecodeTargets:
    def __init__(self, *args, role: str = "both", receiver=None, channel_factory=open_channel, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.role = role
        self.receiver = receiver                 # this replica's KvTransfer servicer: its calls count as load
        self._channel_factory = channel_factory
        self._channels: dict[str, object] = {}

    async def StreamPrompt(self, request_iterator, context):
        metadata = dict(context.invocation_metadata() or ())
        _DECODE_TARGET.set(str(metadata.get(DECODE_TARGET_KEY, "")))
        async for response in super().StreamPrompt(request_iterator, context):
            yield response

    async def _open(self, request_id: str, segments: list[Segment], sampling: SamplingParams, priority: int,
                    arrived: float, complete: bool) -> asyncio.Queue:
        """A StreamPrompt call naming a decode replica is prefilled here and decoded there; every other
        call is served as on any replica (Generate too: its prompt arrives whole, nothing to overlap)."""
        target = _DECODE_TARGET.get()
        if not target or complete:
            return await super()._open(request_id, segments, sampling, priority, arrived, complete)
        events: asyncio.Queue = asyncio.Queue()
        await self._hand_off(request_id, target, segments, sampling, priority, arrived, events)
        return events

    async def _hand_off(self, request_id: str, target: str, segments: list[Segment], sampling: SamplingParams,
                        priority: int, arrived: float, events: asyncio.Queue) -> None:
        """Start the request here for `target`; its events go on `events` (the backend's)."""
        raise NotImplementedError

    def _stub(self, target: str) -> kv_transfer_pb2_grpc.KvTransferStub:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = self._channel_factory(target)
        return kv_transfer_pb2_grpc.KvTransferStub(channel)

    async def GetStats(self, request, context):
        response = await super().GetStats(request, context)
        response.stats.role = self.role    # for the orchestrator's pairing (orchestrator/pairing.py)
        if self.receiver is not None:      # a decode replica's load is the transfers it decodes
            response.stats.num_active += self.receiver.active
        return response

    async def close_channels(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
