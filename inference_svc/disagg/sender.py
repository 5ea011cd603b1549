"""The prefill side of a KV transfer: one `HandOff` per request prefilled here and decoded elsewhere.

The request runs in this engine under a local id (`<id>@prefill`) as a prompt that never completes:
the scheduler prefills every chunk as it arrives and never samples. After each engine step (and
after each command), `poll` exports the KV computed since the last shipment (`kv_export`: whole
blocks, a partly filled last block is sent again with the next chunk) and queues it for the
transfer call (`transfer_call.TransferCall`, the same on the vLLM backend). An update that
invalidates past what the decode replica holds sends `truncate` first. At finish the suffix is
appended here; once the last token's KV is computed and shipped, `finish` follows and the local
request is aborted (its blocks free, its full blocks stay in the prefix cache). The decode
replica's events are relayed to the caller as this call's events.

Fall-back: if the transfer call fails (the decode replica died, refused or lost the request), the
request is decoded here, and the answer does not change: before the hand-off the local request
simply completes (`Engine.finish`); after it, a new local request (`<id>@fallback`) holds the prompt
and the tokens already relayed, and decodes the rest (its prompt's full blocks are usually still in
the prefix cache). A KV_TRANSFER_FALLBACK event records why.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import time

from inference_svc.engine.engine import Engine, EngineInputError, lcp_length
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.kv_export import export_blocks, layout_of
from inference_svc.engine.request import RequestState, RequestStats, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.transfer_call import TransferCall, TransferFailed, tokens_per_message
from inference_svc.kv_transfer.wire import finish_reason
from inference_svc.native.engine_thread import EngineThread
from inference_svc.rpc.errors import status_for
from inference_svc.rpc.summary import RequestSummary
from protos import common_pb2, inference_pb2, kv_transfer_pb2_grpc

log = logging.getLogger(__name__)


class HandOff:
    def __init__(self, request_id: str, target: str, stub: kv_transfer_pb2_grpc.KvTransferStub,
                 engine_thread: EngineThread, sampling: SamplingParams, priority: int, arrived: float,
                 client: asyncio.Queue) -> None:
        self.request_id = request_id
        self.local_id = f"{request_id}@prefill"
        self.fallback_id = f"{request_id}@fallback"
        self.target = target
        self.thread = engine_thread
        self.layout = None                       # the engine's KV layout (set by `open`; kv_export.KvLayout)
        self.sampling = sampling
        self.priority = priority
        self.arrived = arrived
        self.last_input = arrived
        self.client = client                     # the caller's event queue (the servicer's `_pump`)
        self.loop = asyncio.get_running_loop()
        self.call = TransferCall(request_id, target, stub, sampling, client, lambda: self.last_input,
                                 priority=priority)
        # engine-thread state
        self.shipped = 0                         # tokens whose KV was sent
        self.shipped_ids: list[int] = []
        self.finishing = False                   # finish arrived: ship the tail, then hand off
        self.stopped = False                     # no more shipping (handed off or fallen back)
        self.local_alive = False
        self.local_aborted = False               # the hand-off freed the local request (its end is not the call's)
        self.prompt: list[int] = []
        self.local_stats: RequestStats | None = None
        # event-loop state
        self.fallen_back = False
        self.done = False
        self.tasks: list[asyncio.Task] = []

    # --- engine thread ------------------------------------------------------------------
    def open(self, engine: Engine, segments: list[Segment]) -> None:
        engine.open(self.local_id, segments, self.sampling, self.priority, arrived_at=self.arrived)
        self.local_alive = True
        self.layout = layout_of(engine)
        self._put(("begin", self.layout))
        self.poll(engine)

    def append(self, engine: Engine, segments: list[Segment], arrived: float) -> None:
        engine.append(self.local_id, segments, arrived_at=arrived)
        self.poll(engine)

    def update(self, engine: Engine, segments: list[Segment], arrived: float, final: bool) -> None:
        engine.update(self.local_id, segments, arrived_at=arrived, final=final)
        request = engine.requests[self.local_id]
        valid = min(lcp_length(self.shipped_ids, request.prompt_token_ids), request.num_computed_tokens)
        if not self.stopped and valid < self.shipped:     # both sides drop the KV past it
            self.shipped, self.shipped_ids = valid, self.shipped_ids[:valid]
            self._put(("truncate", valid))
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
        if self.stopped:                         # fallen back before finish: decode here
            engine.finish(self.local_id, arrived_at=arrived)
            return
        self.finishing = True
        self.poll(engine)

    def poll(self, engine: Engine) -> None:
        """Ship what was computed since the last shipment; hand off once the tail is shipped."""
        if self.stopped:
            return
        request = engine.requests.get(self.local_id)
        if request is None or request.is_finished:
            return
        computed = request.num_computed_tokens
        if request.state is RequestState.RUNNING and computed > self.shipped:
            start = self.shipped - self.shipped % self.layout.block_size
            step = tokens_per_message(self.layout)
            for first in range(start, computed, step):
                end = min(first + step, computed)
                self._put(("blocks", first, request.prompt_token_ids[first:end],
                           export_blocks(engine, request, first, end)))
            self.shipped, self.shipped_ids = computed, request.prompt_token_ids[:computed]
        if self.finishing and self.shipped == request.num_prompt_tokens:
            self.prompt = list(request.prompt_token_ids)
            self.local_stats = copy.copy(request.stats)
            self.stopped = True
            self.local_alive = False
            self.local_aborted = True            # set before the abort's events exist: the relay drops them
            self._put(("finish", time.perf_counter()))   # the tail's KV is computed: time the transfer from here
            engine.abort(self.local_id)          # frees this side's blocks

    def fall_back(self, engine: Engine) -> None:
        """Decode here (the transfer failed)."""
        self.stopped = True
        if self.local_alive:
            if self.finishing:
                engine.finish(self.local_id)
            return
        remaining = self.sampling.max_tokens - len(self.call.relayed)
        tokens = self.prompt + self.call.relayed
        sampling = dataclasses.replace(self.sampling, max_tokens=max(remaining, 1))
        engine.open(self.fallback_id, [Segment(token_ids=tuple(tokens))], sampling, self.priority)
        engine.finish(self.fallback_id)

    def _put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.call.outbox.put_nowait, item)

    # --- event loop -----------------------------------------------------------------------
    def start(self, local_events: asyncio.Queue) -> None:
        self.tasks = [asyncio.create_task(self._relay_local(local_events, self.local_id)),
                      asyncio.create_task(self._transfer())]

    def note_input(self, arrived: float) -> None:
        self.last_input = arrived

    async def _transfer(self) -> None:
        try:
            done = await self.call.run()
        except TransferFailed as exc:
            await self._fall_back(exc.reason)
            return
        self.done = True
        self.client.put_nowait(self._summary(done, time.monotonic()))

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

    async def _fall_back(self, reason: str) -> None:
        if self.done or self.fallen_back:
            return
        self.fallen_back = True
        log.warning("%s: KV transfer to %s failed (%s); decoding here", self.request_id, self.target, reason)
        self._emit(EventKind.KV_TRANSFER_FALLBACK, detail=f"decode replica {self.target}: {reason}; decoding here")
        if self.call.finish_sent_at is not None and len(self.call.relayed) >= self.sampling.max_tokens:
            done = inference_pb2.InferenceDone(finish_reason=common_pb2.FINISH_REASON_LENGTH)
            self.client.put_nowait(self._summary(done, time.monotonic()))   # every token arrived: only done was lost
            return
        fallback_events = self.thread.subscribe(self.fallback_id)
        self.tasks.append(asyncio.create_task(self._relay_local(fallback_events, self.fallback_id)))
        try:
            await self.thread.call(self.fall_back)
        except Exception as exc:
            self.client.put_nowait(status_for(exc))

    async def _relay_local(self, events: asyncio.Queue, local_id: str) -> None:
        """This replica's events for a local request, as the caller's. Before a fall-back the local
        request never decodes, and its end (the abort after the hand-off) is not the caller's."""
        forced = len(self.call.relayed) if local_id == self.fallback_id else 0
        while True:
            item = await events.get()
            handed_off = local_id == self.local_id and self.local_aborted
            if isinstance(item, EngineEvent):
                if item.kind is EventKind.FINISHED and (handed_off or not self.fallen_back):
                    continue
                if item.kind is EventKind.FIRST_TOKEN and self.call.relayed and local_id == self.fallback_id:
                    continue
                self.client.put_nowait(dataclasses.replace(item, request_id=self.request_id))
            elif isinstance(item, RequestSummary):
                if self.fallen_back and not handed_off:
                    if local_id == self.fallback_id:
                        outputs = tuple(self.call.relayed[:forced]) + item.output_token_ids
                        item = dataclasses.replace(item, prompt_tokens=len(self.prompt), output_token_ids=outputs)
                    self.client.put_nowait(dataclasses.replace(item, request_id=self.request_id))
                return
            else:                                # an ErrorStatus or an engine failure: the call's end
                self.client.put_nowait(item)
                return

    def _emit(self, kind: EventKind, count: int = 0, detail: str = "") -> None:
        self.client.put_nowait(EngineEvent(self.request_id, kind, time.monotonic(), count=count, detail=detail))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.thread.unsubscribe(self.local_id)
        self.thread.unsubscribe(self.fallback_id)
        self.thread.abort_soon(self.local_id)
        self.thread.abort_soon(self.fallback_id)

