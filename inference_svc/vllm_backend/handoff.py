"""The prefill side of a KV transfer on vLLM: a StreamPrompt call whose metadata names a decode
replica (`DECODE_TARGET_KEY`, what the orchestrator's pairing sends) is prefilled here and decoded
there, over the same `KvTransfer.Transfer` call as the native engine's (`protos/kv_transfer.proto`).

`HandOffRequest` is a `VllmRequest` whose submissions carry our connector's `SHIP_KEY`
(`kv_connector.py`): while the context streams in, each turn of the streaming-input session is
prefilled as on a colocated replica, and when the turn ends its KV (already in the spool, written by
the connector after the forward pass) goes out as `blocks` messages. An update that resubmits sends
`truncate` to what both sides still agree on, and the new submission ships from there (the prefix
cache serves those blocks, and they are shipped from the cache too). `finish` sends the suffix as
one more prefill-only turn; once its KV is shipped, `finish` goes to the decode replica and the
session here ends (its blocks return to the pool, the full ones stay in the prefix cache). The
decode replica's events come back on the transfer call and are the caller's events.

Fall-back: if the transfer call fails before the decode replica sent a token, the request finishes
here as any colocated request does (the answer is the same; after the hand-off the whole prompt is
submitted again, the prefix cache holding most of it); once tokens were relayed the call ends with
UNAVAILABLE (the native backend resubmits the prompt and the relayed tokens there; not done here).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import time

import grpc

from inference_svc.disagg.sender import MAX_MESSAGE_BYTES, RELAYED_KINDS
from inference_svc.disagg.wire import (
    DECODE_TARGET_KEY,
    event_from_proto,
    finish_reason,
    layout_to_proto,
    sampling_to_proto,
)
from inference_svc.engine.engine import lcp_length
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.kv_export import KvLayout, to_bytes
from inference_svc.engine.request import RequestStats, Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.rpc.errors import ErrorStatus
from inference_svc.rpc.summary import RequestSummary
from inference_svc.vllm_backend.kv_spool import SHIP_KEY, KvSpool
from inference_svc.vllm_backend.servicer import VllmServicer
from inference_svc.vllm_backend.session import VllmRequest
from protos import kv_transfer_pb2, kv_transfer_pb2_grpc
from servicekit.channels import open_channel

log = logging.getLogger(__name__)

# The decode replica the running StreamPrompt call asked for ("" = none); set per call (its own task).
_DECODE_TARGET: contextvars.ContextVar[str] = contextvars.ContextVar("vllm_decode_target", default="")


class HandOffRequest(VllmRequest):
    def __init__(self, *args, target: str, stub: kv_transfer_pb2_grpc.KvTransferStub, layout: KvLayout,
                 spool: KvSpool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.target = target
        self.stub = stub
        self.layout = layout
        self.spool = spool
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.shipped_ids: list[int] = []          # prompt tokens whose KV the decode replica holds (sent)
        self._ship_dir: str | None = None
        self._finish_segments: list[Segment] | None = None
        self.handed_off = False
        self.fallen_back = False
        self.relayed: list[int] = []
        self.bytes_sent = 0
        self._sent_at: list[tuple[str, int, int, float]] = []   # unacked blocks: tokens, blocks, bytes, time
        self._finish_sent_at: float | None = None
        self._tasks: list[asyncio.Task] = []

    # --- caller input ---------------------------------------------------------------------
    def open(self, segments, arrived_at: float) -> None:
        self.outbox.put_nowait(("begin",))
        super().open(segments, arrived_at)        # bad input raises here, before any transfer call
        self._tasks.append(asyncio.create_task(self._transfer(), name=f"kv-transfer-{self.request_id}"))

    def finish(self, segments, arrived_at: float) -> None:
        if self.fallen_back:
            return super().finish(segments, arrived_at)
        self.prompt.finish(segments)
        self._finish_segments = list(segments)
        self._arrived(arrived_at)
        # The suffix (and anything held back) as one more prefill-only turn; hand off when it is shipped.
        self._submit_up_to(len(self.prompt.tokens), wait=False)
        self._maybe_hand_off()

    def close(self) -> None:
        super().close()
        for task in self._tasks:
            task.cancel()
        if self._ship_dir is not None:
            self.spool.drop_ship_dir(self._ship_dir)

    # --- the connector's side of each submission and turn ----------------------------------
    def _kv_params(self) -> dict | None:
        if self.fallen_back or self.handed_off:
            return None
        # A resubmission: the decode replica keeps only what both prompts share.
        valid = lcp_length(self.shipped_ids, self.prompt.tokens)
        if valid < len(self.shipped_ids):
            self.shipped_ids = self.shipped_ids[:valid]
            self.outbox.put_nowait(("truncate", valid))
        if self._ship_dir is not None:
            self.spool.drop_ship_dir(self._ship_dir)
        self._ship_dir = self.spool.new_ship_dir()
        return {SHIP_KEY: {"dir": self._ship_dir, "from": len(self.shipped_ids)}}

    def _after_turn(self) -> None:
        if self.fallen_back or self.handed_off:
            return
        self._ship()
        self._maybe_hand_off()

    def _ship(self) -> None:
        """What the connector wrote since the last turn, as `blocks` messages of at most 16 MiB."""
        bs = self.layout.block_size
        per_message = max(1, MAX_MESSAGE_BYTES // self.layout.nbytes(1)) * bs     # tokens
        for shipment in self.spool.take_shipments(self._ship_dir) if self._ship_dir else []:
            for first in range(0, len(shipment.token_ids), per_message):
                token_ids = shipment.token_ids[first:first + per_message]
                kv = shipment.kv[:, :, first // bs:-(-(first + len(token_ids)) // bs)]
                self.outbox.put_nowait(("blocks", shipment.start + first, token_ids, kv))
            self.shipped_ids = self.shipped_ids[:shipment.start] + list(shipment.token_ids)

    def _maybe_hand_off(self) -> None:
        """Once the whole prompt is submitted, prefilled and shipped: `finish`, and end the session here."""
        if (self.handed_off or self.fallen_back or self._finish_segments is None or self._inputs is None
                or self._turns_done != self._turns_sent or self._submitted != len(self.prompt.tokens)):
            return
        self._ship()
        if self.shipped_ids != self.prompt.tokens:
            self._fail_over(f"the prefill side shipped {len(self.shipped_ids)} of {len(self.prompt.tokens)} "
                            "prompt tokens")
            return
        self.handed_off = True
        self.outbox.put_nowait(("finish",))
        self._stop_incarnation()          # aborts the session: its blocks return to the pool
        self.spool.drop_ship_dir(self._ship_dir)
        self._ship_dir = None

    # --- the transfer call --------------------------------------------------------------------
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
        except Exception as exc:       # a bug here must not lose the answer
            log.exception("%s: transfer to %s failed", self.request_id, self.target)
            reason = repr(exc)
        finally:
            writer.cancel()
        call.cancel()
        self._fail_over(reason)

    async def _write(self, call) -> None:
        rid = self.request_id
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):     # the reader sees the failure
            while True:
                item = await self.outbox.get()
                kind = item[0]
                if kind == "begin":
                    self._emit(EventKind.KV_TRANSFER_START, detail=f"to {self.target}")
                    message = kv_transfer_pb2.TransferRequest(request_id=rid, begin=kv_transfer_pb2.KvBegin(
                        sampling=sampling_to_proto(self.sampling), layout=layout_to_proto(self.layout)))
                elif kind == "blocks":
                    _, start, token_ids, kv = item
                    raw = to_bytes(kv)
                    message = kv_transfer_pb2.TransferRequest(request_id=rid, blocks=kv_transfer_pb2.KvBlocks(
                        start_token=start, token_ids=token_ids, num_blocks=kv.shape[2], data=raw))
                    self._sent_at.append((f"{start}-{start + len(token_ids)}", kv.shape[2], len(raw),
                                          time.perf_counter()))
                    self.bytes_sent += len(raw)
                elif kind == "truncate":
                    message = kv_transfer_pb2.TransferRequest(
                        request_id=rid, truncate=kv_transfer_pb2.KvTruncate(valid_tokens=item[1]))
                    self._sent_at.append((f"truncate to {item[1]}", 0, 0, time.perf_counter()))
                else:
                    message = kv_transfer_pb2.TransferRequest(request_id=rid, finish=kv_transfer_pb2.KvFinish())
                    self._finish_sent_at = time.perf_counter()
                await call.write(message)
                if kind == "finish":
                    await call.done_writing()
                    return

    def _on_ack(self, ack: kv_transfer_pb2.KvAck) -> None:
        if ack.finished:
            ms = (time.perf_counter() - (self._finish_sent_at or time.perf_counter())) * 1e3
            after_input_ms = (time.monotonic() - self.stats.last_input_time) * 1e3
            self._emit(EventKind.KV_HANDOFF, count=self.bytes_sent,
                       detail=f"{ack.tokens} tokens, {self.bytes_sent} bytes; finish acked {ms:.1f} ms after it "
                              f"was sent; hand-off {after_input_ms:.1f} ms after the last input")
            return
        if not self._sent_at:
            return
        tokens, blocks, nbytes, sent = self._sent_at.pop(0)
        if blocks:
            ms = (time.perf_counter() - sent) * 1e3
            self._emit(EventKind.KV_TRANSFER_CHUNK, count=nbytes,
                       detail=f"tokens {tokens}, {blocks} blocks, {nbytes} bytes, {ms:.1f} ms, "
                              f"{ack.imported_tokens} held")

    def _on_event(self, event) -> bool:
        """A decode-side event; True once the request is done."""
        kind = event.WhichOneof("kind")
        now = time.monotonic()
        if kind == "token":
            if not self.relayed:
                self.stats.first_token_time = now
            self.relayed.append(event.token.id)
            self.events.put_nowait(EngineEvent(self.request_id, EventKind.TOKEN, now, token_id=event.token.id,
                                               text=event.token.text))
        elif kind == "lifecycle":
            relayed = event_from_proto(self.request_id, event.lifecycle, now)
            if relayed is not None and relayed.kind in RELAYED_KINDS:
                detail = f"decode replica: {relayed.detail}" if relayed.detail else "decode replica"
                self.events.put_nowait(dataclasses.replace(relayed, detail=detail))
        elif kind == "done":
            self._done(event.done, now)
            return True
        return False

    def _done(self, done, now: float) -> None:
        remote = done.stats
        stats: RequestStats = dataclasses.replace(
            self.stats, finish_time=now,
            tokens_computed=len(self.prompt.tokens) - self.stats.prefix_cache_hit_tokens + remote.tokens_computed,
            prefix_cache_hit_tokens=self.stats.prefix_cache_hit_tokens + remote.prefix_cache_hit_tokens,
            preemptions_recompute=self.stats.preemptions_recompute + remote.preemptions_recompute)
        self.finished = True
        summary = RequestSummary(self.request_id, finish_reason(done.finish_reason), stats,
                                 len(self.prompt.tokens), tuple(self.relayed), done.text)
        self.on_end(summary)
        self.events.put_nowait(summary)

    def _fail_over(self, reason: str) -> None:
        if self.finished or self.fallen_back:
            return
        self.fallen_back = True
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        log.warning("%s: KV transfer to %s failed (%s)", self.request_id, self.target, reason)
        if self.handed_off and self.relayed:
            self.events.put_nowait(ErrorStatus(grpc.StatusCode.UNAVAILABLE,
                                               f"the decode replica {self.target} failed after the hand-off: {reason}"))
            return
        self._emit(EventKind.KV_TRANSFER_FALLBACK, detail=f"decode replica {self.target}: {reason}; decoding here")
        if self._ship_dir is not None:
            self.spool.drop_ship_dir(self._ship_dir)
            self._ship_dir = None
        if self._finish_segments is not None:      # finish already arrived: finish here, as a colocated request
            super().finish(self._finish_segments, self.stats.last_input_time)


class VllmDisaggServicer(VllmServicer):
    """`VllmServicer` that hands off a StreamPrompt call naming a decode replica, and reports its role."""

    def __init__(self, *args, role: str, layout: KvLayout, spool: KvSpool, receiver=None,
                 channel_factory=open_channel, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.role = role
        self.layout = layout
        self.spool = spool
        self.receiver = receiver             # this replica's KvTransfer servicer: its calls count as load
        self._channel_factory = channel_factory
        self._channels: dict[str, object] = {}

    async def StreamPrompt(self, request_iterator, context):
        metadata = dict(context.invocation_metadata() or ())
        _DECODE_TARGET.set(str(metadata.get(DECODE_TARGET_KEY, "")))
        async for response in super().StreamPrompt(request_iterator, context):
            yield response

    async def _open(self, request_id: str, segments: list[Segment], sampling: SamplingParams, priority: int,
                    arrived: float, complete: bool) -> asyncio.Queue:
        target = _DECODE_TARGET.get()
        if not target or complete:
            return await super()._open(request_id, segments, sampling, priority, arrived, complete)
        events: asyncio.Queue = asyncio.Queue()
        request = HandOffRequest(self.llm, request_id, self.new_prompt(), sampling, events, self.decode, arrived,
                                 self.stats.request_ended, target=target, stub=self._stub(target),
                                 layout=self.layout, spool=self.spool)
        try:
            request.open(segments, arrived)
        except Exception:
            request.close()
            raise
        self._requests[request_id] = request
        self.stats.request_received()
        return events

    def _stub(self, target: str) -> kv_transfer_pb2_grpc.KvTransferStub:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = self._channel_factory(target)
        return kv_transfer_pb2_grpc.KvTransferStub(channel)

    async def GetStats(self, request, context):
        response = await super().GetStats(request, context)
        if self.receiver is not None:      # a decode replica's load is the transfers it decodes
            response.stats.num_active += self.receiver.active
        return response

    def _engine_stats(self):
        stats = super()._engine_stats()
        stats.role = self.role
        return stats

    async def close_channels(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
