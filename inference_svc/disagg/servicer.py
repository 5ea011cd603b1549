"""The native `Inference` servicer with hand-offs: a StreamPrompt call whose metadata names a decode
replica (`wire.DECODE_TARGET_KEY`) is prefilled here and decoded there (`sender.HandOff`); every
other call is served exactly as `NativeServicer` serves it. Generate is always colocated (its
prompt arrives whole: nothing to overlap)."""

from __future__ import annotations

import asyncio

from inference_svc.disagg.sender import HandOff
from inference_svc.engine.engine import Engine
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.decode_targets import DecodeTargets
from inference_svc.native.servicer import NativeServicer


class DisaggServicer(DecodeTargets, NativeServicer):
    """`role`, `receiver`, `channel_factory`: `DecodeTargets`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._handoffs: dict[str, HandOff] = {}
        self._polled: tuple[HandOff, ...] = ()   # what the engine thread polls (replaced, never mutated)

    # --- the backend hook -------------------------------------------------------------
    async def _hand_off(self, request_id: str, target: str, segments: list[Segment], sampling: SamplingParams,
                        priority: int, arrived: float, events: asyncio.Queue) -> None:
        handoff = HandOff(request_id, target, self._stub(target), self.engine_thread, sampling, priority, arrived,
                          events)
        self._handoffs[request_id] = handoff
        self._polled = tuple(self._handoffs.values())
        handoff.start(self.engine_thread.subscribe(handoff.local_id))
        self._submit(lambda engine: handoff.open(engine, segments), events)

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
