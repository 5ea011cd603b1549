"""The decode side of a KV transfer: the `KvTransfer` servicer.

One call is one request. `begin` opens it in the engine with an empty prompt; each `blocks`
message appends its tokens and imports their KV through the scheduler (`kv_export.import_blocks`):
the request is never runnable on tokens whose KV is still to come, so nothing is computed twice.
Should the scheduler decline (the request was preempted, or no block is free), the tokens are still
appended and the engine computes them itself; the answer is the same. `truncate` is an update to the
first `valid_tokens` tokens (the engine's own invalidation), `finish` lets the request decode: the
engine computes the last prompt token, samples the first token and decodes. Every message is acked
once applied; the request's events follow on the same call. The call ending, any way, aborts the
request, so its blocks are freed. The call itself (the first message's checks, the order of the
rest, the responses) is `kv_transfer/receive_call.KvTransferServicerBase`, shared with the vLLM
backend; this module is how the engine applies the messages.
"""

from __future__ import annotations

import asyncio
import logging

from inference_svc.engine.engine import Engine
from inference_svc.engine.kv_export import KvLayout, import_blocks
from inference_svc.engine.request import Segment
from inference_svc.kv_transfer.receive_call import SERVICE_NAME, Ack, KvTransferServicerBase, check_blocks
from inference_svc.native.engine_thread import EngineThread
from inference_svc.rpc.errors import KvTransferError, KvTransferUnknownRequest, status_for
from protos import kv_transfer_pb2

log = logging.getLogger(__name__)

__all__ = ["SERVICE_NAME", "Ack", "KvTransferServicer"]


class KvTransferServicer(KvTransferServicerBase):
    def __init__(self, engine_thread: EngineThread, layout: KvLayout, num_device_blocks: int) -> None:
        super().__init__(layout, num_device_blocks)
        self.engine_thread = engine_thread
        self._failed: dict[str, bool] = {}      # per open call: a command failed, the rest do nothing

    # --- the backend hook -------------------------------------------------------------
    async def _open(self, request_id, begin, sampling) -> asyncio.Queue:
        events = self.engine_thread.subscribe(request_id)
        try:
            await self.engine_thread.call(lambda e: e.open(request_id, (), sampling, begin.priority))
        except Exception:
            self.engine_thread.unsubscribe(request_id)
            raise
        self._failed[request_id] = False
        return events

    def _apply(self, request_id: str, kind: str, message, events: asyncio.Queue) -> None:
        """Commands are queued for the engine thread without waiting for the previous one: those that
        arrive while a step runs are applied together when it ends. The tail's blocks and `finish`
        arrive about a millisecond apart, so the hand-off waits for one step boundary, not two.
        The engine thread runs them in order and their acks follow in the same order; once one
        fails, the rest of the call's commands do nothing (the call ends with that failure)."""
        if kind == "blocks":
            apply = self._blocks_command(request_id, message)
        elif kind == "truncate":
            apply = _truncate_command(request_id, message.valid_tokens)
        else:
            apply = _finish_command(request_id)

        def guarded(engine: Engine):
            if self._failed.get(request_id, True):
                return None
            try:
                return apply(engine)
            except Exception:
                self._failed[request_id] = True
                raise

        def on_applied(future: asyncio.Future) -> None:
            if future.cancelled():
                return
            if future.exception() is not None:
                events.put_nowait(status_for(future.exception()))
            elif future.result() is not None:
                events.put_nowait(future.result())

        self.engine_thread.submit(guarded).add_done_callback(on_applied)

    def _refused(self, request_id: str) -> None:
        self._failed[request_id] = True

    def _close(self, request_id: str) -> None:
        self._failed.pop(request_id, None)
        self.engine_thread.unsubscribe(request_id)
        self.engine_thread.abort_soon(request_id)

    def _blocks_command(self, request_id: str, blocks: kv_transfer_pb2.KvBlocks):
        """Validated here, on the event loop; applied on the engine thread."""
        data = check_blocks(blocks, self.layout, self.num_device_blocks)
        start, token_ids = blocks.start_token, list(blocks.token_ids)

        def apply(engine: Engine) -> Ack:
            request = _receiving(engine, request_id)
            have = request.num_prompt_tokens
            if start > have:
                raise KvTransferError(f"blocks from token {start}, but only {have} tokens arrived")
            if request.prompt_token_ids[start:have] != token_ids[:have - start]:
                raise KvTransferError("blocks restate tokens that differ from those already received")
            new = token_ids[have - start:]
            if new:
                engine.append(request_id, [Segment(token_ids=tuple(new))])
            imported = import_blocks(engine, request, start, start + len(token_ids), data)
            return Ack(request.num_prompt_tokens, imported)

        return apply


def _receiving(engine: Engine, request_id: str):
    request = engine.requests.get(request_id)
    if request is None or request.is_finished or request.context_complete:
        raise KvTransferUnknownRequest(f"no transfer in progress for request {request_id!r}")
    return request


def _truncate_command(request_id: str, valid: int):
    def apply(engine: Engine) -> Ack:
        request = _receiving(engine, request_id)
        if not 0 <= valid <= request.num_prompt_tokens:
            raise KvTransferError(f"truncate to {valid} tokens: the request has {request.num_prompt_tokens}")
        kept = request.prompt_token_ids[:valid]
        engine.update(request_id, [Segment(token_ids=tuple(kept))] if kept else [])
        return Ack(request.num_prompt_tokens, 0)

    return apply


def _finish_command(request_id: str):
    def apply(engine: Engine) -> Ack:
        request = _receiving(engine, request_id)
        engine.finish(request_id)
        return Ack(request.num_prompt_tokens, 0, finished=True)

    return apply


