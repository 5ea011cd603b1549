"""The decode side of a KV transfer on vLLM: the `KvTransfer` servicer of a vLLM replica.

One call is one request, with the native receiver's messages, checks and statuses
(`inference_svc/disagg/receiver.py`, docs/disagg.md "Errors"; the first message's checks and the
responses are written once, in `inference_svc/kv_transfer/receive_call.py`). `blocks` and `truncate` build the
prompt and its KV here, in memory (`ReceivedPrompt`); vLLM has nothing to hold them in before the
request exists, and it cannot take a prompt that is still growing with KV imported into it. At
`finish` the KV goes to the spool (`kv_spool.py`) and the whole prompt is submitted as one request
sampled with the sender's parameters; our connector (`kv_connector.py`) reports the tokens whose KV
arrived as already computed and copies them into the request's blocks, so vLLM computes only the
last prompt token, then samples and decodes. The request's events go back on the call; the call
ending, any way, aborts the request (its blocks are freed) and deletes its spool file.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable

import torch

from inference_svc.engine.engine import DuplicateRequestError
from inference_svc.engine.kv_export import KvLayout, blocks_for_range
from inference_svc.engine.request import Segment
from inference_svc.kv_transfer.receive_call import SERVICE_NAME, Ack, abort_for, check_blocks, read_begin, respond
from inference_svc.rpc.errors import KvTransferError, KvTransferUnknownRequest, status_for
from inference_svc.vllm_backend.kv_spool import LOAD_KEY, KvSpool
from inference_svc.vllm_backend.prompt import StreamedPrompt
from inference_svc.vllm_backend.session import VllmRequest
from inference_svc.vllm_backend.stats import StatsSource
from protos import kv_transfer_pb2, kv_transfer_pb2_grpc

log = logging.getLogger(__name__)

__all__ = ["SERVICE_NAME", "ReceivedPrompt", "VllmKvTransferServicer"]


class ReceivedPrompt:
    """The prompt tokens and their KV blocks received so far (no vllm: plain tensors)."""

    def __init__(self, layout: KvLayout, num_device_blocks: int) -> None:
        self.layout = layout
        self.num_device_blocks = num_device_blocks
        self.token_ids: list[int] = []
        self.blocks: dict[int, torch.Tensor] = {}       # block index -> [layers, 2, block_size, heads, dim]

    def check_blocks(self, message: kv_transfer_pb2.KvBlocks) -> torch.Tensor:
        """Validate a `blocks` message (the native receiver's checks); its KV as a tensor."""
        return check_blocks(message, self.layout, self.num_device_blocks)

    def add_blocks(self, start: int, token_ids: list[int], kv: torch.Tensor) -> None:
        have = len(self.token_ids)
        if start > have:
            raise KvTransferError(f"blocks from token {start}, but only {have} tokens arrived")
        if self.token_ids[start:start + len(token_ids)] != token_ids[:have - start]:
            raise KvTransferError("blocks restate tokens that differ from those already received")
        if start + len(token_ids) > have:
            self.token_ids = self.token_ids[:start] + list(token_ids)
        first = start // self.layout.block_size
        for i in range(kv.shape[2]):
            self.blocks[first + i] = kv[:, :, i]

    def truncate(self, valid: int) -> None:
        if not 0 <= valid <= len(self.token_ids):
            raise KvTransferError(f"truncate to {valid} tokens: the request has {len(self.token_ids)}")
        self.token_ids = self.token_ids[:valid]
        kept = blocks_for_range(0, valid, self.layout.block_size)
        self.blocks = {i: block for i, block in self.blocks.items() if i < kept}

    def all_blocks(self) -> torch.Tensor:
        """Every block of the prompt, [layers, 2, blocks, block_size, heads, dim]."""
        needed = blocks_for_range(0, len(self.token_ids), self.layout.block_size)
        missing = [i for i in range(needed) if i not in self.blocks]
        if missing:
            raise KvTransferError(f"finish without the KV of block(s) {missing[:4]}")
        return torch.stack([self.blocks[i] for i in range(needed)], dim=2)


class LoadingRequest(VllmRequest):
    """The decode side's vLLM request: its submission asks our connector to load the spooled KV."""

    def __init__(self, *args, load_key: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.load_key = load_key

    def _kv_params(self) -> dict | None:
        return {LOAD_KEY: {"key": self.load_key}}


class VllmKvTransferServicer(kv_transfer_pb2_grpc.KvTransferServicer):
    def __init__(self, llm, new_prompt: Callable[[], StreamedPrompt], decode: Callable[[list[int]], str],
                 stats: StatsSource, layout: KvLayout, num_device_blocks: int, spool: KvSpool) -> None:
        self.llm = llm
        self.new_prompt = new_prompt
        self.decode = decode
        self.stats = stats
        self.layout = layout
        self.num_device_blocks = num_device_blocks
        self.spool = spool
        self.calls = 0          # transfers received
        self.active = 0         # transfers open now
        self._open_ids: set[str] = set()
        self._keys = itertools.count()

    async def Transfer(self, request_iterator, context):
        request_id, _, sampling = await read_begin(request_iterator, context, self.layout)
        if request_id in self._open_ids:
            await abort_for(context, DuplicateRequestError(f"request {request_id!r} is already being transferred here"))
        self._open_ids.add(request_id)
        self.active += 1
        self.calls += 1
        events: asyncio.Queue = asyncio.Queue()
        received = ReceivedPrompt(self.layout, self.num_device_blocks)
        key = f"{os.getpid()}-{next(self._keys)}"
        started: list[LoadingRequest] = []
        reader = asyncio.create_task(self._read(request_iterator, request_id, received, sampling, key, events,
                                                started))
        try:
            async for response in respond(events, context):
                yield response
        finally:
            reader.cancel()
            for request in started:
                if not request.finished:
                    self.stats.request_aborted(request.stats)
                request.close()          # aborts the vLLM request: its blocks are freed
            self.spool.drop_load(key)
            self._open_ids.discard(request_id)
            self.active -= 1

    async def _read(self, request_iterator, request_id: str, received: ReceivedPrompt, sampling, key: str,
                    events: asyncio.Queue, started: list[LoadingRequest]) -> None:
        """Apply blocks / truncate / finish in order; each is acked on `events` once applied."""
        try:
            async for message in request_iterator:
                if message.request_id != request_id:
                    raise KvTransferUnknownRequest(f"this call transfers {request_id!r}, not {message.request_id!r}")
                if started:
                    raise KvTransferError(f"{message.WhichOneof('kind')} after finish")
                kind = message.WhichOneof("kind")
                if kind == "blocks":
                    kv = received.check_blocks(message.blocks)
                    received.add_blocks(message.blocks.start_token, list(message.blocks.token_ids), kv)
                    events.put_nowait(Ack(len(received.token_ids), len(received.token_ids)))
                elif kind == "truncate":
                    received.truncate(message.truncate.valid_tokens)
                    events.put_nowait(Ack(len(received.token_ids), 0))
                elif kind == "finish":
                    started.append(self._decode(request_id, received, sampling, key, events))
                else:
                    raise KvTransferError(f"{kind or 'a message without a kind'} after begin")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            events.put_nowait(status_for(exc))

    def _decode(self, request_id: str, received: ReceivedPrompt, sampling, key: str,
                events: asyncio.Queue) -> LoadingRequest:
        """`finish`: spool the KV, submit the whole prompt; the connector loads what arrived."""
        if not received.token_ids:
            raise KvTransferError("finish before any blocks: the prompt is empty")
        self.spool.write_load(key, received.token_ids, received.all_blocks())
        now = time.monotonic()
        request = LoadingRequest(self.llm, request_id, self.new_prompt(), sampling, events, self.decode, now,
                                 self.stats.request_ended, load_key=key)
        events.put_nowait(Ack(len(received.token_ids), len(received.token_ids), finished=True))
        request.open((), now)
        try:
            request.finish([Segment(token_ids=tuple(received.token_ids))], now)
        except Exception:
            request.close()
            raise
        self.stats.request_received()
        return request
