"""The native `Inference` servicer with hand-offs: a StreamPrompt call whose metadata names a decode
replica (`wire.DECODE_TARGET_KEY`) is prefilled here and decoded there (`sender.HandOff`); every
other call is served exactly as `NativeServicer` serves it. Generate is always colocated (its
prompt arrives whole: nothing to overlap)."""

from __future__ import annotations

import asyncio
import contextvars

from inference_svc.disagg.sender import HandOff
from inference_svc.disagg.wire import DECODE_TARGET_KEY
from inference_svc.engine.engine import Engine
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.native.servicer import NativeServicer
from protos import kv_transfer_pb2_grpc
from servicekit.channels import open_channel

# The decode replica the running StreamPrompt call asked for ("" = none). Each gRPC call runs in
# its own task, so the value set at the start of a call is the one its `_open` sees.
_DECODE_TARGET: contextvars.ContextVar[str] = contextvars.ContextVar("decode_target", default="")


class DisaggServicer(NativeServicer):
    def __init__(self, *args, role: str = "both", receiver=None, channel_factory=open_channel, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.role = role
        self.receiver = receiver                 # this replica's KvTransferServicer: its calls count as load
        self._channel_factory = channel_factory
        self._channels: dict[str, object] = {}
        self._handoffs: dict[str, HandOff] = {}
        self._polled: tuple[HandOff, ...] = ()   # what the engine thread polls (replaced, never mutated)

    async def StreamPrompt(self, request_iterator, context):
        metadata = dict(context.invocation_metadata() or ())
        _DECODE_TARGET.set(str(metadata.get(DECODE_TARGET_KEY, "")))
        async for response in super().StreamPrompt(request_iterator, context):
            yield response

    def _stub(self, target: str) -> kv_transfer_pb2_grpc.KvTransferStub:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = self._channel_factory(target)
        return kv_transfer_pb2_grpc.KvTransferStub(channel)

    # --- the backend hook -------------------------------------------------------------
    async def _open(self, request_id: str, segments: list[Segment], sampling: SamplingParams, priority: int,
                    arrived: float, complete: bool) -> asyncio.Queue:
        target = _DECODE_TARGET.get()
        if not target or complete:
            return await super()._open(request_id, segments, sampling, priority, arrived, complete)
        events: asyncio.Queue = asyncio.Queue()
        handoff = HandOff(request_id, target, self._stub(target), self.engine_thread, sampling, priority, arrived,
                          events)
        self._handoffs[request_id] = handoff
        self._polled = tuple(self._handoffs.values())
        handoff.start(self.engine_thread.subscribe(handoff.local_id))
        self._submit(lambda engine: handoff.open(engine, segments), events)
        return events

    def _send(self, request_id: str, kind: str, segments: list[Segment], arrived: float,
              events: asyncio.Queue, final_stage: bool = True) -> None:
        handoff = self._handoffs.get(request_id)
        if handoff is None:
            return super()._send(request_id, kind, segments, arrived, events, final_stage)
        handoff.note_input(arrived)
        if kind == "append":
            self._submit(lambda engine: handoff.append(engine, segments, arrived), events)
        elif kind == "update":
            self._submit(lambda engine: handoff.update(engine, segments, arrived, final_stage), events)
        else:
            self._submit(lambda engine: handoff.finish(engine, segments, arrived), events)

    def _close(self, request_id: str) -> None:
        handoff = self._handoffs.pop(request_id, None)
        if handoff is None:
            return super()._close(request_id)
        self._polled = tuple(self._handoffs.values())
        asyncio.get_running_loop().create_task(handoff.close())

    # --- on the engine thread, after each step --------------------------------------------
    def after_step(self, engine: Engine) -> None:
        """Ship what the step computed for each hand-off."""
        for handoff in self._polled:
            handoff.poll(engine)

    async def GetStats(self, request, context):
        response = await super().GetStats(request, context)
        if self.receiver is not None:      # a decode replica's load is the transfers it decodes
            response.stats.num_active += self.receiver.active
        return response

    def _snapshot(self, engine: Engine, num_sessions: int):
        stats = super()._snapshot(engine, num_sessions)
        stats.role = self.role
        return stats

    async def close_channels(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
