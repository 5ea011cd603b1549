"""The prefill side's `KvTransfer.Transfer` call, for both backends (native `sender.HandOff`, vLLM
`vllm_backend/handoff.HandOffRequest`): what goes on the wire and what comes back is the same
whichever engine computed the KV; only how blocks are exported and what a failure falls back to
differ, and stay with each backend.

The backend queues messages on `outbox` as tuples, in order:
`("begin", layout)`, `("blocks", start_token, token_ids, kv)` (kv: [layers, 2, blocks, ...]),
`("truncate", valid_tokens)`, `("finish", kv_ready_at)`. `kv_ready_at` (a `perf_counter` time, or
None) is when the tail's KV was computed: with it the hand-off event times the transfer from there
("transfer N ms after the last chunk's KV", the native bench parses it); without it, from when
`finish` went out ("finish acked N ms after it was sent").

`run` writes them, reads the acks (KV_TRANSFER_CHUNK / KV_HANDOFF events) and the decode replica's
events (tokens and the relayed lifecycle events, put on `events` as the caller's), and returns the
decode side's `InferenceDone`; it raises `TransferFailed` with the reason if the call ends without it.
No engine and no vllm here: plain tensors, protos and gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable

import grpc

from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.kv_export import KvLayout, to_bytes
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.wire import event_from_proto, layout_to_proto, sampling_to_proto
from protos import inference_pb2, kv_transfer_pb2, kv_transfer_pb2_grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024     # a chunk's blocks go in messages of at most this many bytes
# Decode-side lifecycle events the caller also gets (the rest: this replica reports its own).
RELAYED_KINDS = frozenset({EventKind.FIRST_TOKEN, EventKind.FINISHED, EventKind.PREEMPTED_SWAP,
                           EventKind.PREEMPTED_RECOMPUTE, EventKind.ERROR})


def tokens_per_message(layout: KvLayout) -> int:
    """How many tokens' blocks one `blocks` message carries: whole blocks, at most MAX_MESSAGE_BYTES."""
    return max(1, MAX_MESSAGE_BYTES // layout.nbytes(1)) * layout.block_size


class TransferFailed(Exception):
    """The call ended without the decode side's answer; `reason` says why (for the fall-back event)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class _Shipment:
    tokens: str          # "start-end", or "truncate to N"
    blocks: int
    nbytes: int
    sent: float          # perf_counter


class TransferCall:
    def __init__(self, request_id: str, target: str, stub: kv_transfer_pb2_grpc.KvTransferStub,
                 sampling: SamplingParams, events: asyncio.Queue, last_input: Callable[[], float], *,
                 priority: int = 0, ack_word: str = "imported") -> None:
        self.request_id = request_id
        self.target = target
        self.stub = stub
        self.sampling = sampling
        self.priority = priority
        self.events = events                     # the caller's event queue
        self.last_input = last_input             # monotonic time of the caller's last input
        self.ack_word = ack_word                 # what the decode side did with a chunk ("imported", "held")
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.relayed: list[int] = []             # token ids the decode side sent
        self.first_token_at: float | None = None
        self.bytes_sent = 0
        self.finish_sent_at: float | None = None
        self.kv_ready_at: float | None = None
        self.in_flight: deque[_Shipment] = deque()

    async def run(self) -> inference_pb2.InferenceDone:
        call = self.stub.Transfer()
        writer = asyncio.create_task(self._write(call))
        try:
            async for response in call:
                if response.WhichOneof("kind") == "ack":
                    self._on_ack(response.ack)
                elif (done := self._on_event(response.event)) is not None:
                    return done
            reason = "the decode replica ended the transfer before the answer"
        except asyncio.CancelledError:
            call.cancel()
            raise
        except grpc.RpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:   # a bug here must not lose the answer: the backend falls back
            log.exception("%s: transfer to %s failed", self.request_id, self.target)
            reason = repr(exc)
        finally:
            writer.cancel()
        call.cancel()
        raise TransferFailed(reason)

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
                    self.kv_ready_at = item[1]
                    self.finish_sent_at = time.perf_counter()
                await call.write(message)
                if kind == "finish":
                    await call.done_writing()
                    return

    def _on_ack(self, ack: kv_transfer_pb2.KvAck) -> None:
        if ack.finished:
            after_input_ms = (time.monotonic() - self.last_input()) * 1e3
            self._emit(EventKind.KV_HANDOFF, count=self.bytes_sent,
                       detail=f"{ack.tokens} tokens, {self.bytes_sent} bytes; {self._handoff_timing()}; "
                              f"hand-off {after_input_ms:.1f} ms after the last input")
            return
        if not self.in_flight:
            return
        shipment = self.in_flight.popleft()
        ms = (time.perf_counter() - shipment.sent) * 1e3
        if shipment.blocks:
            self._emit(EventKind.KV_TRANSFER_CHUNK, count=shipment.nbytes,
                       detail=f"tokens {shipment.tokens}, {shipment.blocks} blocks, {shipment.nbytes} bytes, "
                              f"{ms:.1f} ms, {ack.imported_tokens} {self.ack_word}")

    def _handoff_timing(self) -> str:
        now = time.perf_counter()
        if self.kv_ready_at is not None:
            return f"transfer {(now - self.kv_ready_at) * 1e3:.1f} ms after the last chunk's KV"
        return f"finish acked {(now - (self.finish_sent_at or now)) * 1e3:.1f} ms after it was sent"

    def _on_event(self, event) -> inference_pb2.InferenceDone | None:
        """A decode-side event, relayed to the caller; the `InferenceDone` once the request is done."""
        kind = event.WhichOneof("kind")
        now = time.monotonic()
        if kind == "token":
            if self.first_token_at is None:
                self.first_token_at = now
            self.relayed.append(event.token.id)
            self.events.put_nowait(EngineEvent(self.request_id, EventKind.TOKEN, now, token_id=event.token.id,
                                               text=event.token.text))
        elif kind == "lifecycle":
            relayed = event_from_proto(self.request_id, event.lifecycle, now)
            if relayed is not None and relayed.kind in RELAYED_KINDS:
                detail = f"decode replica: {relayed.detail}" if relayed.detail else "decode replica"
                self.events.put_nowait(dataclasses.replace(relayed, detail=detail))
        elif kind == "done":
            return event.done
        return None

    def _emit(self, kind: EventKind, count: int = 0, detail: str = "") -> None:
        self.events.put_nowait(EngineEvent(self.request_id, kind, time.monotonic(), count=count, detail=detail))
