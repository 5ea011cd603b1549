"""The prefill side of a KV transfer on the native engine: one `HandOff` per request prefilled here
and decoded elsewhere. What is shipped when, the hand-off and the fall-back are the state machine of
`kv_transfer/handoff.PrefillHandOff` (the same on vLLM); this module is how the engine feeds it.

The request runs in this engine under a local id (`<id>@prefill`) as a prompt that never completes:
the scheduler prefills every chunk as it arrives and never samples. After each engine step (and
after each command), `poll` exports the KV computed since the last shipment (`kv_export`: whole
blocks, a partly filled last block is sent again with the next chunk). An update applies the
engine's own invalidation, and truncates what the decode replica holds to the same point. At finish
the suffix is appended here; once the last token's KV is computed and shipped, the hand-off follows
and the local request is aborted (its blocks free, its full blocks stay in the prefix cache). The
decode replica's events are relayed to the caller as this call's events.

Shipping, the hand-off and the fall-back's choice run on the engine thread; the transfer call and
the relays on the event loop. Decoding here after a fall-back: before the hand-off the local request
simply completes (`Engine.finish`); after it, a new local request (`<id>@fallback`) holds the prompt
and the tokens already relayed, and decodes the rest (its prompt's full blocks are usually still in
the prefix cache).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time

from inference_svc.engine.engine import Engine, EngineInputError
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.kv_export import export_blocks, layout_of
from inference_svc.engine.request import RequestState, RequestStats, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.handoff import PrefillHandOff
from inference_svc.kv_transfer.wire import finish_reason
from inference_svc.native.engine_thread import EngineThread
from inference_svc.rpc.errors import status_for
from inference_svc.rpc.summary import RequestSummary
from protos import common_pb2, inference_pb2, kv_transfer_pb2_grpc
from servicekit.continuation import STOP


class HandOff(PrefillHandOff):
    def __init__(self, request_id: str, target: str, stub: kv_transfer_pb2_grpc.KvTransferStub,
                 engine_thread: EngineThread, sampling: SamplingParams, priority: int, arrived: float,
                 events: asyncio.Queue) -> None:
        self.request_id = request_id
        self.local_id = f"{request_id}@prefill"
        self.fallback_id = f"{request_id}@fallback"
        self.thread = engine_thread
        self.layout = None                       # the engine's KV layout (set by `open`; kv_export.KvLayout)
        self.sampling = sampling
        self.priority = priority
        self.arrived = arrived
        self.last_input = arrived
        self.events = events                     # the caller's event queue (the servicer's `_pump`)
        self.loop = asyncio.get_running_loop()
        super().__init__(target=target, stub=stub, priority=priority)
        self.prompt: list[int] = []              # at the hand-off: the whole prompt, and its local stats
        self.local_stats: RequestStats | None = None
        self.tasks: list[asyncio.Task] = []

    # --- engine thread ------------------------------------------------------------------
    def open(self, engine: Engine, segments: list[Segment]) -> None:
        engine.open(self.local_id, segments, self.sampling, self.priority, arrived_at=self.arrived)
        self.layout = layout_of(engine)
        self._put(("begin", self.layout))
        self.poll(engine)

    def append(self, engine: Engine, segments: list[Segment], arrived: float) -> None:
        engine.append(self.local_id, segments, arrived_at=arrived)
        self.poll(engine)

    def update(self, engine: Engine, segments: list[Segment], arrived: float, final: bool) -> None:
        engine.update(self.local_id, segments, arrived_at=arrived, final=final)
        request = engine.requests[self.local_id]
        self._truncate(request.prompt_token_ids, request.num_computed_tokens)
        self.poll(engine)

    def finish(self, engine: Engine, segments: list[Segment], arrived: float) -> None:
        request = engine.requests.get(self.local_id)
        if request is None or request.is_finished:
            raise EngineInputError(f"finish: request {self.request_id!r} is already finished")
        if segments:
            engine.append(self.local_id, segments, arrived_at=arrived)
        if not request.prompt_token_ids:
            raise EngineInputError("the prompt is empty")
        request.speculative_limit = None         # the prompt is final: prefill all of it
        if self.fallen_back:                     # fallen back before finish: decode here
            engine.finish(self.local_id, arrived_at=arrived)
            return
        self.finishing = True
        self.poll(engine)

    def poll(self, engine: Engine) -> None:
        """Ship what was computed since the last shipment; hand off once the tail is shipped."""
        if not self.shipping:
            return
        request = engine.requests.get(self.local_id)
        if request is None or request.is_finished:
            return
        computed, shipped = request.num_computed_tokens, len(self.shipped_ids)
        if request.state is RequestState.RUNNING and computed > shipped:
            start = shipped - shipped % self.layout.block_size
            self._ship(start, request.prompt_token_ids[start:computed],
                       lambda first, end: export_blocks(engine, request, first, end))
        if self.finishing and len(self.shipped_ids) == request.num_prompt_tokens:
            self.prompt = list(request.prompt_token_ids)
            self.local_stats = copy.copy(request.stats)
            # handed_off is set before the abort's events exist: the relay drops them
            self._hand_off(time.perf_counter())  # the tail's KV is computed: time the transfer from here
            engine.abort(self.local_id)          # frees this side's blocks

    # --- the fall-back's hooks (on the engine thread: `_at_fall_back`) ----------------------
    def _finish_here(self) -> None:
        self.thread.engine.finish(self.local_id)

    def _resume(self, relayed: list[int], remaining: int) -> None:
        """The continuation (servicekit/continuation.py): the prompt and the relayed tokens, `remaining` more."""
        engine = self.thread.engine
        sampling = dataclasses.replace(self.sampling, max_tokens=remaining)
        engine.open(self.fallback_id, [Segment(token_ids=tuple(self.prompt + relayed))], sampling, self.priority)
        engine.finish(self.fallback_id)

    def _put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.call.outbox.put_nowait, item)

    # --- event loop -----------------------------------------------------------------------
    def start(self, local_events: asyncio.Queue) -> None:
        self.tasks = [asyncio.create_task(self._relay_local(local_events, self.local_id)),
                      asyncio.create_task(self._transfer())]

    def note_input(self, arrived: float) -> None:
        self.last_input = arrived

    def _last_input(self) -> float:
        return self.last_input

    def _answer(self, done: inference_pb2.InferenceDone) -> None:
        self.events.put_nowait(self._summary(done, time.monotonic()))

    def _end_relayed(self, relayed: list[int], reason: str) -> None:
        done = inference_pb2.InferenceDone(finish_reason=common_pb2.FINISH_REASON_STOP if reason == STOP
                                           else common_pb2.FINISH_REASON_LENGTH)
        self.events.put_nowait(self._summary(done, time.monotonic()))

    def _stop_token_ids(self) -> tuple[int, ...]:
        eos = () if self.sampling.ignore_eos else tuple(self.thread.engine.runner.eos_token_ids)
        return (*self.sampling.stop_token_ids, *eos)

    def _at_fall_back(self, decide) -> None:
        """On the engine thread, which ships and hands off; the fall-back request's events relayed."""
        fallback_events = self.thread.subscribe(self.fallback_id)
        self.tasks.append(asyncio.create_task(self._relay_local(fallback_events, self.fallback_id)))
        self.tasks.append(asyncio.create_task(self._decide_on_engine(decide)))

    async def _decide_on_engine(self, decide) -> None:
        try:
            await self.thread.call(lambda engine: decide())
        except Exception as exc:
            self.events.put_nowait(status_for(exc))

    def _summary(self, done, now: float) -> RequestSummary:
        local = self.local_stats or RequestStats()
        remote = done.stats
        stats = RequestStats(
            arrival_time=self.arrived, last_input_time=self.last_input, first_scheduled_time=local.first_scheduled_time,
            first_token_time=self.call.first_token_at, finish_time=now, time_queued_s=local.time_queued_s,
            tokens_computed=local.tokens_computed + remote.tokens_computed, tokens_invalidated=local.tokens_invalidated,
            prefix_cache_hit_tokens=local.prefix_cache_hit_tokens + remote.prefix_cache_hit_tokens,
            preemptions_swap=local.preemptions_swap + remote.preemptions_swap,
            preemptions_recompute=local.preemptions_recompute + remote.preemptions_recompute,
            num_appends=local.num_appends, num_updates=local.num_updates, draft_tokens=remote.draft_tokens,
            accepted_draft_tokens=remote.accepted_draft_tokens)
        return RequestSummary(self.request_id, finish_reason(done.finish_reason), stats, len(self.prompt),
                              tuple(self.call.relayed), done.text)

    async def _relay_local(self, events: asyncio.Queue, local_id: str) -> None:
        """This replica's events for a local request, as the caller's. Before a fall-back the local
        request never decodes, and its end (the abort after the hand-off) is not the caller's."""
        forced = len(self.call.relayed) if local_id == self.fallback_id else 0
        while True:
            item = await events.get()
            handed_off = local_id == self.local_id and self.handed_off
            if isinstance(item, EngineEvent):
                if item.kind is EventKind.FINISHED and (handed_off or not self.fallen_back):
                    continue
                if item.kind is EventKind.FIRST_TOKEN and self.call.relayed and local_id == self.fallback_id:
                    continue
                self.events.put_nowait(dataclasses.replace(item, request_id=self.request_id))
            elif isinstance(item, RequestSummary):
                if self.fallen_back and not handed_off:
                    if local_id == self.fallback_id:
                        outputs = tuple(self.call.relayed[:forced]) + item.output_token_ids
                        item = dataclasses.replace(item, prompt_tokens=len(self.prompt), output_token_ids=outputs)
                    self.events.put_nowait(dataclasses.replace(item, request_id=self.request_id))
                return
            else:                                # an ErrorStatus or an engine failure: the call's end
                self.events.put_nowait(item)
                return

    def _emit(self, kind: EventKind, *, count: int = 0, detail: str = "") -> None:
        self.events.put_nowait(EngineEvent(self.request_id, kind, time.monotonic(), count=count, detail=detail))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.thread.unsubscribe(self.local_id)
        self.thread.unsubscribe(self.fallback_id)
        self.thread.abort_soon(self.local_id)
        self.thread.abort_soon(self.fallback_id)

