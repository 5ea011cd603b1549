"""The prefill side of a KV transfer: one `HandOff` per request prefilled here and decoded elsewhere.

The request runs in this engine under a local id (`<id>@prefill`) as a prompt that never completes:
the scheduler prefills every chunk as it arrives and never samples. After each engine step (and
after each command), `poll` exports the KV computed since the last shipment (`kv_export`: whole
blocks, a partly filled last block is sent again with the next chunk) and queues it for the
transfer call. An update that invalidates past what the decode replica holds sends `truncate`
first. At finish the suffix is appended here; once the last token's KV is computed and shipped,
`finish` follows and the local request is aborted (its blocks free, its full blocks stay in the
prefix cache). The decode replica's events are relayed to the caller as this call's events.

Fall-back: if the transfer call fails (the decode replica died, refused or lost the request), the
request is decoded here, and the answer does not change: before the hand-off the local request
simply completes (`Engine.finish`); after it, a new local request (`<id>@fallback`) holds the prompt
and the tokens already relayed, and decodes the rest (its prompt's full blocks are usually still in
the prefix cache). A KV_TRANSFER_FALLBACK event records why.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import time
from collections import deque

import grpc

from inference_svc.disagg.wire import event_from_proto, finish_reason, layout_to_proto, sampling_to_proto
from inference_svc.engine.engine import Engine, EngineInputError, lcp_length
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.kv_export import export_blocks, layout_of, to_bytes
from inference_svc.engine.request import RequestState, RequestStats, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.native.engine_thread import EngineThread
from inference_svc.rpc.errors import status_for
from inference_svc.rpc.summary import RequestSummary
from protos import common_pb2, inference_pb2, kv_transfer_pb2, kv_transfer_pb2_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024     # a chunk's blocks go in messages of at most this many bytes
# Decode-side lifecycle events the caller also gets (the rest: this replica reports its own).
RELAYED_KINDS = frozenset({EventKind.FIRST_TOKEN, EventKind.FINISHED, EventKind.PREEMPTED_SWAP,
                           EventKind.PREEMPTED_RECOMPUTE, EventKind.ERROR})


@dataclasses.dataclass
class _Shipment:
    tokens: str
    blocks: int
    nbytes: int
    sent: float


class HandOff:
    def __init__(self, request_id: str, target: str, stub: kv_transfer_pb2_grpc.KvTransferStub,
                 engine_thread: EngineThread, sampling: SamplingParams, priority: int, arrived: float,
                 client: asyncio.Queue) -> None:
        self.request_id = request_id
        self.local_id = f"{request_id}@prefill"
        self.fallback_id = f"{request_id}@fallback"
        self.target = target
        self.stub = stub
        self.thread = engine_thread
        self.sampling = sampling
        self.priority = priority
        self.arrived = arrived
        self.last_input = arrived
        self.client = client                     # the caller's event queue (the servicer's `_pump`)
        self.loop = asyncio.get_running_loop()
        self.outbox: asyncio.Queue = asyncio.Queue()
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
        self.relayed: list[int] = []
        self.first_token_at: float | None = None
        self.finish_sent_at: float | None = None
        self.tail_ready_at: float | None = None  # perf_counter when the tail's KV was computed and queued
        self.bytes_sent = 0
        self.in_flight: deque[_Shipment] = deque()
        self.tasks: list[asyncio.Task] = []

    # --- engine thread ------------------------------------------------------------------
    def open(self, engine: Engine, segments: list[Segment]) -> None:
        engine.open(self.local_id, segments, self.sampling, self.priority, arrived_at=self.arrived)
        self.local_alive = True
        self._put(("begin", layout_of(engine)))
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
            bs = engine.scheduler.block_size
            start = self.shipped - self.shipped % bs
            step = max(1, MAX_MESSAGE_BYTES // engine.runner.bytes_per_block) * bs   # tokens per message
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
            self.tail_ready_at = time.perf_counter()
            self._put(("finish",))
            engine.abort(self.local_id)          # frees this side's blocks

    def fall_back(self, engine: Engine) -> None:
        """Decode here (the transfer failed)."""
        self.stopped = True
        if self.local_alive:
            if self.finishing:
                engine.finish(self.local_id)
            return
        remaining = self.sampling.max_tokens - len(self.relayed)
        tokens = self.prompt + self.relayed
        sampling = dataclasses.replace(self.sampling, max_tokens=max(remaining, 1))
        engine.open(self.fallback_id, [Segment(token_ids=tuple(tokens))], sampling, self.priority)
        engine.finish(self.fallback_id)

    def _put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.outbox.put_nowait, item)

    # --- event loop -----------------------------------------------------------------------
    def start(self, local_events: asyncio.Queue) -> None:
        self.tasks = [asyncio.create_task(self._relay_local(local_events, self.local_id)),
                      asyncio.create_task(self._transfer())]

    def note_input(self, arrived: float) -> None:
        self.last_input = arrived

    async def _transfer(self) -> None:
        call = self.stub.Transfer()
        writer = asyncio.create_task(self._write(call))
        try:
            async for response in call:
                if response.WhichOneof("kind") == "ack":
                    self._on_ack(response.ack)
                elif self._on_event(response.event):
                    return
            reason = "the decode replica ended the transfer before the answer"
        except asyncio.CancelledError:
            call.cancel()
            raise
        except grpc.RpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:   # a bug here must not lose the answer: decode locally
            log.exception("%s: transfer to %s failed", self.request_id, self.target)
            reason = repr(exc)
        finally:
            writer.cancel()
        call.cancel()
        await self._fall_back(reason)

    async def _write(self, call) -> None:
        rid = self.request_id
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):   # the reader sees the failure
            while True:
                item = await self.outbox.get()
                kind = item[0]
                if kind == "begin":
                    self._emit(EventKind.KV_TRANSFER_START, detail=f"to {self.target}")
                    message = kv_transfer_pb2.TransferRequest(request_id=rid, begin=kv_transfer_pb2.KvBegin(
                        sampling=sampling_to_proto(self.sampling), priority=self.priority,
                        layout=layout_to_proto(item[1])))
                elif kind == "blocks":
                    _, start, token_ids, data = item
                    raw = to_bytes(data)
                    message = kv_transfer_pb2.TransferRequest(request_id=rid, blocks=kv_transfer_pb2.KvBlocks(
                        start_token=start, token_ids=token_ids, num_blocks=data.shape[2], data=raw))
                    self.in_flight.append(_Shipment(f"{start}-{start + len(token_ids)}", data.shape[2], len(raw),
                                                    time.perf_counter()))
                    self.bytes_sent += len(raw)
                elif kind == "truncate":
                    message = kv_transfer_pb2.TransferRequest(
                        request_id=rid, truncate=kv_transfer_pb2.KvTruncate(valid_tokens=item[1]))
                    self.in_flight.append(_Shipment(f"truncate to {item[1]}", 0, 0, time.perf_counter()))
                else:
                    message = kv_transfer_pb2.TransferRequest(request_id=rid, finish=kv_transfer_pb2.KvFinish())
                    self.finish_sent_at = time.perf_counter()
                await call.write(message)
                if kind == "finish":
                    await call.done_writing()
                    return

    def _on_ack(self, ack: kv_transfer_pb2.KvAck) -> None:
        if ack.finished:
            after_input_ms = (time.monotonic() - self.last_input) * 1e3
            after_tail_ms = (time.perf_counter() - (self.tail_ready_at or time.perf_counter())) * 1e3
            self._emit(EventKind.KV_HANDOFF, count=self.bytes_sent,
                       detail=f"{ack.tokens} tokens, {self.bytes_sent} bytes; transfer {after_tail_ms:.1f} ms after "
                              f"the last chunk's KV; hand-off {after_input_ms:.1f} ms after the last input")
            return
        if not self.in_flight:
            return
        shipment = self.in_flight.popleft()
        ms = (time.perf_counter() - shipment.sent) * 1e3
        if shipment.blocks:
            self._emit(EventKind.KV_TRANSFER_CHUNK, count=shipment.nbytes,
                       detail=f"tokens {shipment.tokens}, {shipment.blocks} blocks, {shipment.nbytes} bytes, "
                              f"{ms:.1f} ms, {ack.imported_tokens} imported")

    def _on_event(self, event) -> bool:
        """A decode-side event; True once the request is done."""
        kind = event.WhichOneof("kind")
        now = time.monotonic()
        if kind == "token":
            if self.first_token_at is None:
                self.first_token_at = now
            self.relayed.append(event.token.id)
            self.client.put_nowait(EngineEvent(self.request_id, EventKind.TOKEN, now, token_id=event.token.id,
                                               text=event.token.text))
        elif kind == "lifecycle":
            relayed = event_from_proto(self.request_id, event.lifecycle, now)
            if relayed is not None and relayed.kind in RELAYED_KINDS:
                self.client.put_nowait(dataclasses.replace(relayed, detail=_on_decode(relayed.detail)))
        elif kind == "done":
            self.done = True
            self.client.put_nowait(self._summary(event.done, now))
            return True
        return False

    def _summary(self, done, now: float) -> RequestSummary:
        local = self.local_stats or RequestStats()
        remote = done.stats
        stats = RequestStats(
            arrival_time=self.arrived, last_input_time=self.last_input, first_scheduled_time=local.first_scheduled_time,
            first_token_time=self.first_token_at, finish_time=now, time_queued_s=local.time_queued_s,
            tokens_computed=local.tokens_computed + remote.tokens_computed, tokens_invalidated=local.tokens_invalidated,
            prefix_cache_hit_tokens=local.prefix_cache_hit_tokens + remote.prefix_cache_hit_tokens,
            preemptions_swap=local.preemptions_swap + remote.preemptions_swap,
            preemptions_recompute=local.preemptions_recompute + remote.preemptions_recompute,
            num_appends=local.num_appends, num_updates=local.num_updates, draft_tokens=remote.draft_tokens,
            accepted_draft_tokens=remote.accepted_draft_tokens)
        return RequestSummary(self.request_id, finish_reason(done.finish_reason), stats, len(self.prompt),
                              tuple(self.relayed), done.text)

    async def _fall_back(self, reason: str) -> None:
        if self.done or self.fallen_back:
            return
        self.fallen_back = True
        log.warning("%s: KV transfer to %s failed (%s); decoding here", self.request_id, self.target, reason)
        self._emit(EventKind.KV_TRANSFER_FALLBACK, detail=f"decode replica {self.target}: {reason}; decoding here")
        if self.finish_sent_at is not None and len(self.relayed) >= self.sampling.max_tokens:
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
        forced = len(self.relayed) if local_id == self.fallback_id else 0
        while True:
            item = await events.get()
            handed_off = local_id == self.local_id and self.local_aborted
            if isinstance(item, EngineEvent):
                if item.kind is EventKind.FINISHED and (handed_off or not self.fallen_back):
                    continue
                if item.kind is EventKind.FIRST_TOKEN and self.relayed and local_id == self.fallback_id:
                    continue
                self.client.put_nowait(dataclasses.replace(item, request_id=self.request_id))
            elif isinstance(item, RequestSummary):
                if self.fallen_back and not handed_off:
                    if local_id == self.fallback_id:
                        outputs = tuple(self.relayed[:forced]) + item.output_token_ids
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


def _on_decode(detail: str) -> str:
    return f"decode replica: {detail}" if detail else "decode replica"
