"""The decode side's `KvTransfer.Transfer` call, written once for both backends:
`KvTransferServicerBase` (native `disagg/receiver.KvTransferServicer`, vLLM
`vllm_backend/kv_receiver.VllmKvTransferServicer`) reads the first message (`read_begin`: it must be
a `begin` for this replica's KV layout), reads the rest in order, sends the responses (`respond`) and
counts the calls; each `blocks` message has its own checks (`check_blocks`). A backend implements
the hook, in the `rpc.servicer.StreamServicerBase` way:

- `_open(request_id, begin, sampling)`: start receiving the request; returns the queue its
  responses' items arrive on (`respond`). Raising refuses the call with the error's status.
- `_apply(request_id, kind, message, events)`: apply a `blocks`, `truncate` or `finish` message
  (`kind`; `message` is the `KvBlocks`, `KvTruncate` or `KvFinish`) in order, its `Ack` on
  `events` once applied. Raising here, or an `ErrorStatus` on `events`, ends the call with that
  status.
- `_check(request_id, kind)`: refuse a message before it is looked at (nothing by default).
- `_refused(request_id)`: a message was refused; the call is ending (nothing by default).
- `_close(request_id)`: the call is over (any reason, once `_open` returned): abort the request,
  free what it holds.

How the blocks are held and the request decoded stays with each backend. Neither the native engine
nor vllm is imported here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import torch

from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.kv_export import KvLayout, blocks_for_range, from_bytes
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.wire import layout_from_proto
from inference_svc.rpc.convert import check_request_id, done_to_proto, event_to_proto, sampling_from_proto
from inference_svc.rpc.errors import (
    ErrorStatus,
    KvLayoutMismatch,
    KvTransferError,
    KvTransferTooLarge,
    KvTransferUnknownRequest,
    status_for,
)
from inference_svc.rpc.summary import RequestSummary
from protos import kv_transfer_pb2, kv_transfer_pb2_grpc
from servicekit.server import UndecodableRequest

SERVICE_NAME = kv_transfer_pb2.DESCRIPTOR.services_by_name["KvTransfer"].full_name


@dataclass(frozen=True)
class Ack:
    """A message applied: the prompt's tokens so far, those whose KV the message brought."""
    tokens: int
    imported: int
    finished: bool = False


async def abort_for(context, exc: BaseException) -> None:
    """End the call with the status the one error map (`rpc.errors`) gives `exc`."""
    error = status_for(exc)
    await context.abort(error.code, error.message)


async def read_begin(request_iterator, context, layout: KvLayout) -> tuple[str, kv_transfer_pb2.KvBegin,
                                                                           SamplingParams]:
    """The call's first message, which must be a `begin` for this replica's KV layout: its request
    id, the `begin` and its sampling. Anything else ends the call with its status."""
    try:
        first = await anext(aiter(request_iterator))
    except StopAsyncIteration:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty transfer: the first message must be begin")
    except UndecodableRequest as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    request_id = first.request_id
    try:
        check_request_id(request_id)
        if not request_id:
            raise KvTransferError("request_id must not be empty")
        if first.WhichOneof("kind") != "begin":
            raise KvTransferUnknownRequest(
                f"{first.WhichOneof('kind') or 'message'} for request {request_id!r}: no transfer is open for it "
                "(the first message must be begin)")
        begin = first.begin
        if layout_from_proto(begin.layout) != layout:
            raise KvLayoutMismatch(f"KV layout {layout_from_proto(begin.layout)} differs from this replica's "
                                   f"{layout}")
        sampling = sampling_from_proto(begin.sampling, begin.HasField("sampling"))
    except Exception as exc:
        await abort_for(context, exc)
    return request_id, begin, sampling


def check_blocks(blocks: kv_transfer_pb2.KvBlocks, layout: KvLayout, num_device_blocks: int) -> torch.Tensor:
    """A `blocks` message's own checks (where it starts, how many blocks its tokens take, its bytes);
    its KV as a tensor [layers, 2, blocks, block_size, heads, dim]. Whether it follows what arrived
    before is the backend's to check."""
    bs = layout.block_size
    start, count = blocks.start_token, len(blocks.token_ids)
    if blocks.num_blocks > num_device_blocks:
        raise KvTransferTooLarge(f"{blocks.num_blocks} blocks exceed this replica's device pool "
                                 f"({num_device_blocks} blocks)")
    if start < 0 or start % bs or not count:
        raise KvTransferError(f"blocks must start at a multiple of the block size ({bs}) and carry tokens")
    if blocks.num_blocks != blocks_for_range(start, start + count, bs):
        raise KvTransferError(f"{count} tokens take {blocks_for_range(start, start + count, bs)} "
                              f"blocks, not {blocks.num_blocks}")
    try:
        return from_bytes(blocks.data, layout, blocks.num_blocks)
    except ValueError as exc:
        raise KvTransferError(str(exc)) from exc


async def respond(events: asyncio.Queue, context):
    """The call's responses, from what the backend puts on `events`: an `Ack` per message applied,
    the request's engine events, its `RequestSummary` (the last response), or an `ErrorStatus` /
    exception, which ends the call with that status."""
    token_index = 0
    text: list[str] = []
    while True:
        item = await events.get()
        if isinstance(item, Ack):
            yield kv_transfer_pb2.TransferResponse(ack=kv_transfer_pb2.KvAck(
                tokens=item.tokens, imported_tokens=item.imported, finished=item.finished))
        elif isinstance(item, RequestSummary):
            yield kv_transfer_pb2.TransferResponse(event=done_to_proto(item, "".join(text)))
            return
        elif isinstance(item, ErrorStatus):
            await context.abort(item.code, item.message)
        elif isinstance(item, BaseException):
            await context.abort(grpc.StatusCode.INTERNAL, f"engine error: {item}")
        elif isinstance(item, EngineEvent):
            yield kv_transfer_pb2.TransferResponse(event=event_to_proto(item, token_index, 0.0))
            if item.kind is EventKind.TOKEN:
                token_index += 1
                text.append(item.text)


class KvTransferServicerBase(kv_transfer_pb2_grpc.KvTransferServicer):
    """`Transfer`, written once; subclasses implement the hook (the module's docstring)."""

    def __init__(self, layout: KvLayout, num_device_blocks: int) -> None:
        self.layout = layout
        self.num_device_blocks = num_device_blocks
        self.calls = 0          # transfers received
        self.active = 0         # transfers open now (a decode replica's load: `DecodeTargets.GetStats`)

    async def Transfer(self, request_iterator, context):
        request_id, begin, sampling = await read_begin(request_iterator, context, self.layout)
        opened = False
        reader = None
        self.active += 1
        try:
            try:
                events = await self._open(request_id, begin, sampling)
            except Exception as exc:
                await abort_for(context, exc)
            opened = True
            self.calls += 1
            reader = asyncio.create_task(self._read(request_iterator, request_id, events))
            async for response in respond(events, context):
                yield response
        finally:
            self.active -= 1
            if reader is not None:
                reader.cancel()
            if opened:
                self._close(request_id)

    async def _read(self, request_iterator, request_id: str, events: asyncio.Queue) -> None:
        """Apply blocks / truncate / finish in order; a refused message ends the call with its status."""
        try:
            async for message in request_iterator:
                if message.request_id != request_id:
                    raise KvTransferUnknownRequest(f"this call transfers {request_id!r}, not {message.request_id!r}")
                kind = message.WhichOneof("kind")
                self._check(request_id, kind)
                if kind not in ("blocks", "truncate", "finish"):
                    raise KvTransferError(f"{kind or 'a message without a kind'} after begin")
                self._apply(request_id, kind, getattr(message, kind), events)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._refused(request_id)
            events.put_nowait(status_for(exc))

    # --- the backend hook -------------------------------------------------------------
    async def _open(self, request_id: str, begin: kv_transfer_pb2.KvBegin, sampling: SamplingParams) -> asyncio.Queue:
        raise NotImplementedError

    def _apply(self, request_id: str, kind: str, message, events: asyncio.Queue) -> None:
        raise NotImplementedError

    def _check(self, request_id: str, kind: str | None) -> None:
        """Refuse a message (raise) before its kind is looked at; nothing by default."""

    def _refused(self, request_id: str) -> None:
        """A message was refused: the call ends with its status; nothing by default."""

    def _close(self, request_id: str) -> None:
        raise NotImplementedError
