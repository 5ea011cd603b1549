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
ending, any way, aborts the request (its blocks are freed) and deletes its spool file. The call
itself (the first message's checks, the order of the rest, the responses) is
`kv_transfer/receive_call.KvTransferServicerBase`, shared with the native engine; this module is
how vLLM applies the messages.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from inference_svc.engine.engine import DuplicateRequestError
from inference_svc.engine.kv_export import KvLayout, blocks_for_range
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.kv_transfer.receive_call import SERVICE_NAME, Ack, KvTransferServicerBase, check_blocks
from inference_svc.rpc.errors import KvTransferError
from inference_svc.vllm_backend.kv_spool import LOAD_KEY, KvSpool
from inference_svc.vllm_backend.prompt import StreamedPrompt
from inference_svc.vllm_backend.session import VllmRequest
from inference_svc.vllm_backend.stats import StatsSource
from protos import kv_transfer_pb2

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


@dataclass
class _Receiving:
    """One open call: what arrived, its sampling and spool key, and its request once `finish` started it."""
    received: ReceivedPrompt
    sampling: SamplingParams
    key: str
    started: list[LoadingRequest] = field(default_factory=list)


class VllmKvTransferServicer(KvTransferServicerBase):
    def __init__(self, llm, new_prompt: Callable[[], StreamedPrompt], decode: Callable[[list[int]], str],
                 stats: StatsSource, layout: KvLayout, num_device_blocks: int, spool: KvSpool) -> None:
        super().__init__(layout, num_device_blocks)
        self.llm = llm
        self.new_prompt = new_prompt
        self.decode = decode
        self.stats = stats
        self.spool = spool
        self._receiving: dict[str, _Receiving] = {}
        self._keys = itertools.count()

    # --- the backend hook -------------------------------------------------------------
    async def _open(self, request_id, begin, sampling) -> asyncio.Queue:
        if request_id in self._receiving:
            raise DuplicateRequestError(f"request {request_id!r} is already being transferred here")
        self._receiving[request_id] = _Receiving(ReceivedPrompt(self.layout, self.num_device_blocks), sampling,
                                                 f"{os.getpid()}-{next(self._keys)}")
        return asyncio.Queue()

    def _check(self, request_id: str, kind: str | None) -> None:
        if self._receiving[request_id].started:
            raise KvTransferError(f"{kind} after finish")

    def _apply(self, request_id: str, kind: str, message, events: asyncio.Queue) -> None:
        """Applied at once, in order; each is acked on `events`."""
        call = self._receiving[request_id]
        received = call.received
        if kind == "blocks":
            kv = received.check_blocks(message)
            received.add_blocks(message.start_token, list(message.token_ids), kv)
            events.put_nowait(Ack(len(received.token_ids), len(received.token_ids)))
        elif kind == "truncate":
            received.truncate(message.valid_tokens)
            events.put_nowait(Ack(len(received.token_ids), 0))
        else:
            call.started.append(self._decode(request_id, received, call.sampling, call.key, events))

    def _close(self, request_id: str) -> None:
        call = self._receiving.pop(request_id)
        for request in call.started:
            if not request.finished:
                self.stats.request_aborted(request.stats)
            request.close()          # aborts the vLLM request: its blocks are freed
        self.spool.drop_load(call.key)

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
