"""The decode side of a KV transfer: the `KvTransfer` servicer.

One call is one request. `begin` opens it in the engine with an empty prompt; each `blocks`
message appends its tokens and imports their KV through the scheduler (`kv_export.import_blocks`):
the request is never runnable on tokens whose KV is still to come, so nothing is computed twice.
Should the scheduler decline (the request was preempted, or no block is free), the tokens are still
appended and the engine computes them itself; the answer is the same. `truncate` is an update to the
first `valid_tokens` tokens (the engine's own invalidation), `finish` lets the request decode: the
engine computes the last prompt token, samples the first token and decodes. Every message is acked
once applied; the request's events follow on the same call. The call ending, any way, aborts the
request, so its blocks are freed. The first message's checks and the responses are
`receive_call`'s, shared with the vLLM backend.
"""

from __future__ import annotations

import asyncio
import logging

from inference_svc.engine.engine import Engine
from inference_svc.engine.kv_export import KvLayout, import_blocks
from inference_svc.engine.request import Segment
from inference_svc.kv_transfer.receive_call import SERVICE_NAME, Ack, abort_for, check_blocks, read_begin, respond
from inference_svc.native.engine_thread import EngineThread
from inference_svc.rpc.errors import KvTransferError, KvTransferUnknownRequest, status_for
from protos import kv_transfer_pb2, kv_transfer_pb2_grpc

log = logging.getLogger(__name__)

__all__ = ["SERVICE_NAME", "Ack", "KvTransferServicer"]


class KvTransferServicer(kv_transfer_pb2_grpc.KvTransferServicer):
    def __init__(self, engine_thread: EngineThread, layout: KvLayout, num_device_blocks: int) -> None:
        self.engine_thread = engine_thread
        self.layout = layout
        self.num_device_blocks = num_device_blocks
        self.calls = 0          # transfers received
        self.active = 0         # transfers open now

    async def Transfer(self, request_iterator, context):
        request_id, begin, sampling = await read_begin(request_iterator, context, self.layout)
        events = self.engine_thread.subscribe(request_id)
        opened = False
        reader = None
        self.active += 1
        try:
            try:
                await self.engine_thread.call(lambda e: e.open(request_id, (), sampling, begin.priority))
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
            self.engine_thread.unsubscribe(request_id)
            if opened:
                self.engine_thread.abort_soon(request_id)

    async def _read(self, request_iterator, request_id: str, events: asyncio.Queue) -> None:
        """Apply blocks / truncate / finish in order; each is acked on `events` once applied.

        Commands are queued for the engine thread without waiting for the previous one: those that
        arrive while a step runs are applied together when it ends. The tail's blocks and `finish`
        arrive about a millisecond apart, so the hand-off waits for one step boundary, not two.
        The engine thread runs them in order and their acks follow in the same order; once one
        fails, the rest of the call's commands do nothing (the call ends with that failure)."""
        failed = False

        def guarded(apply):
            def run(engine: Engine):
                nonlocal failed
                if failed:
                    return None
                try:
                    return apply(engine)
                except Exception:
                    failed = True
                    raise
            return run

        def on_applied(future: asyncio.Future) -> None:
            if future.cancelled():
                return
            if future.exception() is not None:
                events.put_nowait(status_for(future.exception()))
            elif future.result() is not None:
                events.put_nowait(future.result())

        try:
            async for message in request_iterator:
                if message.request_id != request_id:
                    raise KvTransferUnknownRequest(
                        f"this call transfers {request_id!r}, not {message.request_id!r}")
                kind = message.WhichOneof("kind")
                if kind == "blocks":
                    apply = self._blocks_command(request_id, message.blocks)
                elif kind == "truncate":
                    apply = _truncate_command(request_id, message.truncate.valid_tokens)
                elif kind == "finish":
                    apply = _finish_command(request_id)
                else:
                    raise KvTransferError(f"{kind or 'a message without a kind'} after begin")
                self.engine_thread.submit(guarded(apply)).add_done_callback(on_applied)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failed = True
            events.put_nowait(status_for(exc))

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


