"""The `Inference` gRPC servicer: one implementation of the RPCs over a small backend hook.

`StreamServicerBase` implements StreamPrompt, Generate, Describe and GetStats once for every
backend: stream slots, request ids, validation of messages, the protocol (open → append/update
→ finish), the event pump and error statuses. A backend implements the hook:

- `_open(request_id, segments, sampling, priority, arrived, complete)`: start a request and
  return the queue its events arrive on (`complete`: the segments are the whole prompt, as in
  Generate: open and finish at once). Raising the engine's input errors, or putting an
  `ErrorStatus` on the queue, refuses it.
- `_send(request_id, kind, segments, arrived, events)`: apply an `append`, `update` or
  `finish` without waiting for the engine; a refusal raises here or reaches `events` as an
  `ErrorStatus`.
- `_close(request_id)`: the call is over (any reason): abort the request if it still runs.
- `_engine_stats()`: the snapshot GetStats reports.

The backends: `native.servicer.NativeServicer` (the engine thread) and
`vllm_backend.servicer.VllmServicer` (vLLM's AsyncLLM). A request's events end with a
`RequestSummary` (the `done` message) or an `ErrorStatus` (`errors.status_for`).

Each StreamPrompt call reads client messages in a background task while the handler streams
the request's events back. Reading starts as soon as `open` is read, before the backend has
applied it: each message is timestamped when it arrives, not when the backend is ready for it
(otherwise a chunk sent with the open would count as arriving a step later, and fcfs would rank
it behind prompts that completed in that step). Any protocol violation ends the call with a
status code and the request is aborted, so its blocks are freed; so does the client cancelling
or its deadline passing. Before a StreamPrompt call ends with a status, what the client is still
sending is read (`client_stream.ClientStream.drain`), so the client reads that status and not
gRPC's INTERNAL, whichever backend serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import grpc

from inference_svc.engine.engine import EngineInputError
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.policies import POLICIES
from inference_svc.engine.request import Segment
from inference_svc.engine.sampler import SamplingParams
from inference_svc.options import DEFAULT_MAX_STREAMS
from inference_svc.rpc.client_stream import ClientStream
from inference_svc.rpc.convert import (
    BadRequest,
    check_request_id,
    done_to_proto,
    event_to_proto,
    sampling_from_proto,
    segments_from_proto,
)
from inference_svc.rpc.errors import ErrorStatus, status_for
from inference_svc.rpc.metrics import InferenceMetrics
from inference_svc.rpc.summary import RequestSummary
from inference_svc.rpc.tenancy import CURRENT_SHARE, share_of
from protos import inference_pb2, inference_pb2_grpc
from servicekit.server import UndecodableRequest

log = logging.getLogger(__name__)
SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name


def next_stream_message(message: inference_pb2.StreamPromptRequest, finished: bool) -> tuple[str, list[Segment]]:
    """Check one StreamPrompt message after `open` against the protocol; returns (kind, segments).
    Raises `BadRequest` for a message after finish, a second open, or no kind."""
    kind = message.update.WhichOneof("kind")
    if finished:
        raise BadRequest(f"{kind or 'message'} after finish")
    if kind == "open":
        raise BadRequest("the stream is already open: a second open is not allowed")
    if kind is None:
        raise BadRequest("a PromptUpdate must set open, append, update or finish")
    return kind, segments_from_proto(getattr(message.update, kind).segments)


class StreamServicerBase(inference_pb2_grpc.InferenceServicer):
    """The RPCs, written once; subclasses implement the backend hook below."""

    def __init__(self, model_info: inference_pb2.ModelInfo, metrics: InferenceMetrics,
                 max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        self.model_info = model_info
        self.metrics = metrics
        self.max_streams = max_streams
        self._active: set[str] = set()
        self._open_streams = 0
        self._clock_offset_s = time.time() - time.monotonic()
        self._client_streams: dict[object, ClientStream] = {}    # StreamPrompt calls by their context

    # --- the backend hook -------------------------------------------------------------
    async def _open(self, request_id: str, segments: list[Segment], sampling: SamplingParams, priority: int,
                    arrived: float, complete: bool) -> asyncio.Queue:
        raise NotImplementedError

    def _send(self, request_id: str, kind: str, segments: list[Segment], arrived: float,
              events: asyncio.Queue, final_stage: bool = True) -> None:
        """`final_stage` (updates only): no further refinement follows (PromptReplace.final_stage)."""
        raise NotImplementedError

    def _close(self, request_id: str) -> None:
        raise NotImplementedError

    def _engine_stats(self) -> inference_pb2.EngineStats:
        raise NotImplementedError

    # --- RPCs -----------------------------------------------------------------------
    async def StreamPrompt(self, request_iterator, context) -> AsyncIterator[inference_pb2.StreamPromptResponse]:
        stream = self._client_streams[context] = ClientStream(request_iterator)
        try:
            async with self._stream_slot(context):
                first = await self._first_message(stream, context)
                arrived = time.monotonic()   # the engine's clock: input waits for a running step count
                async with contextlib.aclosing(self._serve(first.update.open, arrived, context, stream)) as run:
                    async for event in run:
                        yield inference_pb2.StreamPromptResponse(event=event)
        finally:
            del self._client_streams[context]

    async def Generate(self, request, context) -> AsyncIterator[inference_pb2.GenerateResponse]:
        arrived = time.monotonic()
        async with self._stream_slot(context), contextlib.aclosing(self._serve(request, arrived, context)) as run:
            async for event in run:
                yield inference_pb2.GenerateResponse(event=event)

    async def Describe(self, request, context) -> inference_pb2.DescribeResponse:
        return inference_pb2.DescribeResponse(model_info=self.model_info)

    async def GetStats(self, request, context) -> inference_pb2.GetStatsResponse:
        """A snapshot published by the backend: never waits for a running engine step."""
        stats = inference_pb2.EngineStats()
        stats.CopyFrom(self._engine_stats())
        stats.max_concurrent_streams = self.max_streams
        stats.num_active = len(self._active)
        return inference_pb2.GetStatsResponse(stats=stats)

    # --- one request ------------------------------------------------------------------
    async def _serve(self, opening, arrived: float, context,
                     request_iterator=None) -> AsyncIterator[inference_pb2.InferenceEvent]:
        """Run one request to its end. `opening`: a PromptOpen or a GenerateRequest (the same
        field names); with `request_iterator` the rest of the stream follows, without it the
        segments are the whole prompt."""
        request_id = await self._admit(opening.request_id, context)
        try:
            segments = await self._parse(context, segments_from_proto, opening.segments)
            sampling = await self._parse(context, sampling_from_proto, opening.sampling, opening.HasField("sampling"))
            self._note_policy_hint(request_id, opening.policy_hint)
            share, priority = await self._parse(context, share_of, context.invocation_metadata())
            CURRENT_SHARE.set(share)             # for the backend's _open (rpc/tenancy.py)
            priority = opening.priority if priority is None else priority
            complete = request_iterator is None
            inbox: asyncio.Queue = asyncio.Queue()
            receiver = None if complete else asyncio.create_task(self._receive(request_iterator, inbox))
            if receiver is not None:
                request_iterator.reader = receiver
            reader = None
            try:
                try:
                    events = await self._open(request_id, segments, sampling, priority, arrived, complete)
                except Exception as exc:
                    await self._abort_with(context, status_for(exc))
                if receiver is not None:
                    reader = asyncio.create_task(self._read_rest(inbox, request_id, events))
                async for event in self._pump(events, context):
                    yield event
            finally:
                for task in (receiver, reader):
                    if task is not None:
                        task.cancel()
        finally:
            self._release(request_id)

    @staticmethod
    async def _receive(request_iterator, inbox: asyncio.Queue) -> None:
        """Take the client's messages as they arrive, each with its arrival time (the engine's
        clock); then None, or the exception that ended the stream."""
        try:
            async for message in request_iterator:
                inbox.put_nowait((message, time.monotonic()))
            inbox.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            inbox.put_nowait(exc)

    async def _read_rest(self, inbox: asyncio.Queue, request_id: str, events: asyncio.Queue) -> None:
        """Apply append/update/finish (from `_receive`) in order; a violation ends the call via the queue.

        Backends apply commands without waiting for the engine, so messages that arrive while a
        step runs (the last update and the finish, typically) are applied together; an
        engine-side rejection still ends the call with its status.
        """
        finished = False
        try:
            while (item := await inbox.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                message, arrived = item
                kind, segments = next_stream_message(message, finished)
                final_stage = kind != "update" or message.update.update.final_stage
                self._send(request_id, kind, segments, arrived, events, final_stage)
                finished = kind == "finish"
            if not finished:
                raise BadRequest("the client closed its stream before finish")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            events.put_nowait(status_for(exc))

    async def _pump(self, events: asyncio.Queue, context) -> AsyncIterator[inference_pb2.InferenceEvent]:
        """The request's events as messages. `done` carries the text the token events carried, so
        the two never disagree."""
        token_index = 0
        text: list[str] = []
        while True:
            item = await events.get()
            if isinstance(item, RequestSummary):
                self._observe_ttft(item)
                yield done_to_proto(item, "".join(text))
                return
            if isinstance(item, ErrorStatus):
                await self._abort_with(context, item)
            if isinstance(item, BaseException):
                await self._abort(context, grpc.StatusCode.INTERNAL, f"engine error: {item}")
            if isinstance(item, EngineEvent):
                yield event_to_proto(item, token_index, self._clock_offset_s)
                if item.kind is EventKind.TOKEN:
                    token_index += 1
                    text.append(item.text)

    def _release(self, request_id: str) -> None:
        self._active.discard(request_id)
        self._close(request_id)

    # --- stream plumbing --------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _stream_slot(self, context) -> AsyncIterator[None]:
        """Hold one of `max_streams` slots for the whole call. Calls are counted, not admitted
        ids: a call holds its slot before its first message arrives."""
        if self._open_streams >= self.max_streams:
            await self._abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"too many open streams (limit {self.max_streams})")
        self._open_streams += 1
        self.metrics.open_streams.inc()
        try:
            yield
        finally:
            self._open_streams -= 1
            self.metrics.open_streams.dec()

    async def _first_message(self, request_iterator, context):
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, "empty stream: the first message must be open")
        except UndecodableRequest as exc:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if first.update.WhichOneof("kind") != "open":
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                              f"the first message must be open, got {first.update.WhichOneof('kind') or 'nothing'}")
        return first

    async def _admit(self, request_id: str, context) -> str:
        request_id = request_id or uuid.uuid4().hex
        try:
            check_request_id(request_id)
        except BadRequest as exc:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request_id in self._active:
            await self._abort(context, grpc.StatusCode.ALREADY_EXISTS, f"request {request_id!r} is already open")
        self._active.add(request_id)
        return request_id

    async def _parse(self, context, fn, *args):
        try:
            return fn(*args)
        except (BadRequest, EngineInputError) as exc:
            await self._abort_with(context, status_for(exc))

    @staticmethod
    def _note_policy_hint(request_id: str, hint: str) -> None:
        """The hint is advisory and the policy engine-wide: an unknown one is only logged."""
        if hint and hint not in POLICIES:
            log.warning("request %s: ignoring unknown policy hint %r (policies: %s)", request_id, hint,
                        ", ".join(POLICIES))

    def _observe_ttft(self, summary: RequestSummary) -> None:
        if summary.stats.first_token_time is not None:
            self.metrics.ttft.labels("open").observe(summary.stats.ttft_from_open_s)
            self.metrics.ttft.labels("last_chunk").observe(summary.stats.ttft_from_last_input_s)

    async def _abort_with(self, context, error: ErrorStatus):
        await self._abort(context, error.code, error.message)

    async def _abort(self, context, code: grpc.StatusCode, message: str):
        self.metrics.rpc_errors.labels(code.name).inc()
        stream = self._client_streams.get(context)
        if stream is not None:
            await stream.drain()     # the client is not left writing into a call that has ended
        await context.abort(code, message)
