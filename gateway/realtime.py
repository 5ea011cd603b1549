"""`/v1/realtime`: streaming input over a WebSocket, mapped onto one `Inference.StreamPrompt`.

The engine prefills the input while it is still being typed, spoken or fetched; decoding starts
at `input.commit`. One connection is one prompt: after `done` (or an `error`) the server closes.
Authentication is the same bearer key, on the handshake's `Authorization` header.

Client events (JSON text frames):

    {"type": "session.update", "session": {"model": "...", "chat": true, "max_tokens": 64,
        "temperature": 0, "top_p": 1, "seed": 7, "stop": ["..."]}}
                      optional, before the first input event; every field optional. `model`
                      defaults to the first served model; `chat: true` (the default) wraps the
                      input in the model's chat format as one user turn, `false` sends it raw
    {"type": "input.append", "text": "..."}
                      more input: one `append` of one segment
    {"type": "input.replace", "text": "..."}
                      the full new input: one `update` (update mode: the engine keeps KV up to
                      the token longest common prefix). The leading segments whose texts the new
                      text still starts with are kept as they are; the rest of it is one segment
    {"type": "input.commit"}
                      the input is complete: `finish` with the chat suffix; decoding starts

Server events:

    {"type": "session.created", "id": "rt-..."}            on connect; the id is the engine's request id
    {"type": "lifecycle", "kind": "QUEUED", "count": 0, "detail": ""}
                      the engine's lifecycle events (QUEUED, SCHEDULED, PREFILL_PROGRESS,
                      INVALIDATED, FIRST_TOKEN, FINISHED, ...), as streamed over gRPC
    {"type": "token", "id": 1234, "text": "Paris", "index": 0}
    {"type": "done", "id": "rt-...", "finish_reason": "stop", "finish_detail": "...", "text": "...",
     "usage": {"prompt_tokens": N, "completion_tokens": N, "total_tokens": N},
     "stats": {...}}  `stats` is gRPC's RequestStats, every field by its proto name, as numbers (ttft_from_open_s,
                      ttft_from_last_chunk_s, prompt_tokens, tokens_computed, tokens_invalidated,
                      num_appends, num_updates, ...); finish_reason: stop | length | abort | error
    {"type": "error", "status": 400, "error": {"message": ..., "type": ..., "param": ..., "code": ...}}
                      then the server closes (1008 for a bad event, 1011 for a service error);
                      `status` is the HTTP status the same failure gets on the HTTP endpoints

A client that disconnects cancels the gRPC call: the engine aborts the request and frees its
KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

import grpc
from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.chat_prompt import StreamedContext, head_segments, suffix_segments
from gateway.errors import GatewayError, from_grpc
from gateway.generation import REQUEST_TIMEOUT_S, Finish, sampling_params
from gateway.protocol import ClientEvent, InputAppend, InputCommit, InputReplace, RealtimeSession, SessionUpdate
from gateway.tenancy import tenant_of
from gateway.upstream import Upstream
from protos import common_pb2, inference_pb2
from protos.metadata import identity_metadata

ROUTE = "/v1/realtime"
CLOSE_BAD_EVENT, CLOSE_SERVICE_ERROR = 1008, 1011


def _event_error(exc: ValidationError) -> GatewayError:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"][1:])      # without the wrapper's "event"
    return GatewayError(400, f"{where}: {first['msg']}" if where else first["msg"], param=where or None)


class RealtimeConnection:
    """One WebSocket: reads client events, writes the prompt, forwards the engine's events."""

    def __init__(self, websocket: WebSocket, upstream: Upstream, metrics) -> None:
        self.ws, self.upstream, self.metrics = websocket, upstream, metrics
        self.request_id = f"rt-{uuid.uuid4().hex}"
        self.session = RealtimeSession()
        self.context = StreamedContext()
        self.chat: inference_pb2.ChatFormat | None = None
        self.call: Any = None
        self.forwarder: asyncio.Task | None = None
        self.committed_at: float | None = None

    async def serve(self) -> None:
        await self.ws.accept()
        try:
            await self.ws.send_json({"type": "session.created", "id": self.request_id})
            while self.committed_at is None:
                await self._handle(await self._next_event())
            await self._until_done()
        except WebSocketDisconnect:
            pass
        except GatewayError as exc:
            await self._fail(exc)
        finally:
            if self.call is not None:
                self.call.cancel()          # a no-op once the call has ended; else the engine frees the request
            if self.forwarder is not None:
                self.forwarder.cancel()

    async def _next_event(self):
        message = await self.ws.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        text = message.get("text")
        if text is None:
            raise GatewayError(400, "events are JSON text frames, not binary ones")
        try:
            return ClientEvent.model_validate({"event": json.loads(text)}).event
        except json.JSONDecodeError as exc:
            raise GatewayError(400, f"an event must be a JSON object: {exc}") from None
        except ValidationError as exc:
            raise _event_error(exc) from None

    async def _handle(self, event) -> None:
        if isinstance(event, SessionUpdate):
            if self.call is not None:
                raise GatewayError(400, "session.update must come before the first input event")
            self.session = event.session
            return
        if self.call is None:
            await self._open()
        if isinstance(event, InputAppend):
            await self._send(append=inference_pb2.PromptAppend(segments=self.context.append(event.text)))
        elif isinstance(event, InputReplace):
            await self._send(update=inference_pb2.PromptReplace(segments=self.context.replace(event.text)))
        elif isinstance(event, InputCommit):
            suffix = suffix_segments(self.chat) if self.session.chat else []
            await self._send(finish=inference_pb2.PromptFinish(segments=suffix))
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self.call.done_writing()
            self.committed_at = time.monotonic()

    async def _open(self) -> None:
        model = self.session.model or next(iter(await self.upstream.served_models()), None)
        if model is None:
            raise GatewayError(503, "no inference replica is reachable")
        self.chat = (await self.upstream.model_info(model)).chat_format
        tenant = tenant_of(self.ws.scope)
        identity = identity_metadata(tenant.name, tenant.weight)
        self.call = self.upstream.inference.StreamPrompt(timeout=REQUEST_TIMEOUT_S,
                                                         metadata=(*self.upstream.metadata, *identity))
        self.forwarder = asyncio.create_task(self._forward(), name=f"realtime-{self.request_id}")
        await self._send(open=inference_pb2.PromptOpen(
            request_id=self.request_id, sampling=sampling_params(self.session),
            segments=head_segments(self.chat) if self.session.chat else []))

    async def _send(self, **update: Any) -> None:
        """Write one prompt message; a call that failed is reported by the forwarder, not here."""
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self.call.write(inference_pb2.StreamPromptRequest(update=inference_pb2.PromptUpdate(**update)))

    async def _until_done(self) -> None:
        """After commit: until the forwarder has sent `done` (or failed), or the client leaves."""
        leaving = asyncio.create_task(self._refuse_more_input())
        try:
            await asyncio.wait({self.forwarder, leaving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
        if leaving.done() and not leaving.cancelled() and leaving.exception() is not None:
            raise leaving.exception()

    async def _refuse_more_input(self) -> None:
        await self._next_event()
        raise GatewayError(400, "the input is committed: no more events are accepted")

    async def _forward(self) -> None:
        try:
            async for response in self.call:
                await self._relay(response.event)
        except grpc.RpcError as exc:
            await self._fail(from_grpc(exc))
            return
        except (WebSocketDisconnect, RuntimeError):   # the client is gone: serve() cancels the call
            return
        with contextlib.suppress(RuntimeError):
            await self.ws.close(1000)

    async def _relay(self, event: inference_pb2.InferenceEvent) -> None:
        kind = event.WhichOneof("kind")
        if kind == "lifecycle":
            name = common_pb2.LifecycleEventKind.Name(event.lifecycle.kind).removeprefix("LIFECYCLE_EVENT_KIND_")
            await self.ws.send_json({"type": "lifecycle", "kind": name, "count": event.lifecycle.count,
                                     "detail": event.lifecycle.detail})
        elif kind == "token":
            if event.token.index == 0 and self.committed_at is not None:
                self.metrics.ttft.labels(ROUTE, "realtime").observe(time.monotonic() - self.committed_at)
            await self.ws.send_json({"type": "token", "id": event.token.id, "text": event.token.text,
                                     "index": event.token.index})
        elif kind == "done":
            done = event.done
            usage = Finish("", done.stats.prompt_tokens, done.stats.generated_tokens).usage()
            await self.ws.send_json({
                "type": "done", "id": done.request_id or self.request_id,
                "finish_reason": common_pb2.FinishReason.Name(done.finish_reason).removeprefix(
                    "FINISH_REASON_").lower(),
                "finish_detail": done.finish_detail, "text": done.text, "usage": usage,
                "stats": {f.name: getattr(done.stats, f.name) for f in done.stats.DESCRIPTOR.fields}})

    async def _fail(self, exc: GatewayError) -> None:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await self.ws.send_json({"type": "error", "status": exc.status, **exc.body()})
            await self.ws.close(CLOSE_SERVICE_ERROR if exc.status >= 500 else CLOSE_BAD_EVENT)


async def realtime(websocket: WebSocket) -> None:
    state = websocket.app.state
    await RealtimeConnection(websocket, state.upstream, state.metrics).serve()
