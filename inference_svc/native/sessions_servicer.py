"""The `Sessions` gRPC servicer of the inference service (native engine only).

Every call but two runs one `SessionManager` method on the engine thread (between steps). The
two exceptions keep latency off the engine thread:
- a Query whose question has a current Flash answer is answered from `flash_answer` at once;
- Subscribe streams the events the manager pushes through `notify` (called on the engine thread,
  handed to each subscriber's queue on the event loop).

Each call's tenant comes from its metadata, as an Inference call's does (rpc/tenancy.py's `share_of`; a
malformed one: INVALID_ARGUMENT): CreateSession makes the session that tenant's, and a Query is charged
to the tenant that asks it, so the engine's fair share ranks session work with every other request.

A query's answer streams like an Inference request's (its events come from the engine thread);
the client leaving aborts the query, and CloseSession ends running queries with ABORTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import grpc

from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.engine.fair_share import Share
from inference_svc.engine.request import FinishReason
from inference_svc.native.engine_thread import EngineThread
from inference_svc.native.sessions import (
    DataUpdated,
    FlashAnswer,
    SessionClosed,
    SessionEvent,
    SessionInfo,
    SessionManager,
)
from inference_svc.rpc.convert import (
    BadRequest,
    check_request_id,
    done_to_proto,
    sampling_from_proto,
    segments_from_proto,
)
from inference_svc.rpc.errors import status_for
from inference_svc.rpc.metrics import InferenceMetrics
from inference_svc.rpc.summary import RequestSummary
from inference_svc.rpc.tenancy import share_of
from protos import common_pb2, sessions_pb2, sessions_pb2_grpc

FLASH_FINISH = common_pb2.FINISH_REASON_STOP


async def abort_for(context, exc: Exception):
    """End the call with the status for `exc` (`rpc.errors`, the map the Inference RPCs use too)."""
    error = status_for(exc)
    await context.abort(error.code, error.message)


def info_to_proto(info: SessionInfo) -> sessions_pb2.SessionInfo:
    return sessions_pb2.SessionInfo(
        session_id=info.session_id, instructions=info.instructions, data_version=info.data_version,
        head_tokens=info.head_tokens, data_tokens=info.data_tokens, computed_tokens=info.computed_tokens,
        retention_tokens=info.retention_tokens, segments=info.segments, dropped_segments=info.dropped_segments,
        flash_questions=list(info.flash_questions), state=info.state, active_queries=info.active_queries)


def event_to_proto(session_id: str, event: SessionEvent) -> sessions_pb2.SessionEvent:
    if isinstance(event, FlashAnswer):
        return sessions_pb2.SessionEvent(session_id=session_id, flash_ready=flash_to_proto(event))
    if isinstance(event, DataUpdated):
        return sessions_pb2.SessionEvent(session_id=session_id, data_updated=sessions_pb2.DataUpdated(
            data_version=event.data_version, data_tokens=event.data_tokens, dropped_segments=event.dropped_segments))
    return sessions_pb2.SessionEvent(session_id=session_id, closed=sessions_pb2.SessionClosed(reason=event.reason))


def flash_to_proto(answer: FlashAnswer) -> sessions_pb2.FlashReady:
    return sessions_pb2.FlashReady(question=answer.question, answer=answer.answer, confidence=answer.confidence,
                                   data_version=answer.data_version, eval_ms=answer.eval_ms)


class SessionsServicer(sessions_pb2_grpc.SessionsServicer):
    def __init__(self, engine_thread: EngineThread, manager: SessionManager,
                 metrics: InferenceMetrics | None = None) -> None:
        self.thread = engine_thread
        self.manager = manager
        self.metrics = metrics or InferenceMetrics()
        manager.notify = self._notify
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchers: dict[str, set[asyncio.Queue]] = {}

    # --- calls that run on the engine thread -------------------------------------------------
    async def _run(self, context, fn):
        """`fn(manager)` on the engine thread; its error ends the call with the matching status."""
        self._loop = asyncio.get_running_loop()
        try:
            return await self.thread.call(lambda engine: fn(self.manager))
        except Exception as exc:
            await abort_for(context, exc)

    async def CreateSession(self, request, context) -> sessions_pb2.CreateSessionResponse:
        session_id = request.session_id or uuid.uuid4().hex[:12]
        await self._check_id(context, session_id)
        share, _ = await self._share(context)
        info = await self._run(context, lambda m: m.create(session_id, request.instructions, request.retention_tokens,
                                                           share))
        return sessions_pb2.CreateSessionResponse(session=info_to_proto(info))

    async def Ingest(self, request_iterator, context) -> sessions_pb2.IngestResponse:
        session_id, batches, segments, version = "", 0, 0, 0
        async for message in request_iterator:
            session_id = session_id or message.session_id
            if not session_id:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first Ingest message must name the session")
            if message.session_id and message.session_id != session_id:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "one Ingest call feeds one session")
            try:
                batch = segments_from_proto(message.segments)
            except Exception as exc:
                await abort_for(context, exc)
            version = await self._run(context, lambda m, s=session_id, b=batch: m.ingest(s, b))
            batches, segments = batches + 1, segments + len(batch)
        if not batches:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an Ingest call needs at least one message")
        info = await self._run(context, lambda m: m.describe(session_id))
        return sessions_pb2.IngestResponse(session_id=session_id, data_version=version, batches=batches,
                                           segments=segments, data_tokens=info.data_tokens,
                                           dropped_segments=info.dropped_segments)

    async def RegisterFlashQuery(self, request, context) -> sessions_pb2.RegisterFlashQueryResponse:
        questions = await self._run(context, lambda m: m.register(request.session_id, request.question,
                                                                   request.max_tokens))
        return sessions_pb2.RegisterFlashQueryResponse(session_id=request.session_id, questions=questions)

    async def UnregisterFlashQuery(self, request, context) -> sessions_pb2.UnregisterFlashQueryResponse:
        questions = await self._run(context, lambda m: m.unregister(request.session_id, request.question))
        return sessions_pb2.UnregisterFlashQueryResponse(session_id=request.session_id, questions=questions)

    async def DescribeSession(self, request, context) -> sessions_pb2.DescribeSessionResponse:
        info = await self._run(context, lambda m: m.describe(request.session_id))
        return sessions_pb2.DescribeSessionResponse(session=info_to_proto(info))

    async def ListSessions(self, request, context) -> sessions_pb2.ListSessionsResponse:
        infos = await self._run(context, lambda m: m.list())
        return sessions_pb2.ListSessionsResponse(sessions=[info_to_proto(info) for info in infos])

    async def CloseSession(self, request, context) -> sessions_pb2.CloseSessionResponse:
        info = await self._run(context, lambda m: m.close(request.session_id))
        return sessions_pb2.CloseSessionResponse(session=info_to_proto(info))

    # --- Query ----------------------------------------------------------------------------
    async def Query(self, request, context) -> AsyncIterator[sessions_pb2.QueryResponse]:
        arrived = time.perf_counter()
        session_id = request.session_id
        flash = self.manager.flash_answer(session_id, request.question,   # no engine step to wait for
                                          request.min_data_version)
        if flash is not None:
            for message in self._flash_reply(flash, arrived):
                yield message
            return
        request_id = request.request_id or f"query-{uuid.uuid4().hex[:12]}"
        await self._check_id(context, request_id)
        try:
            sampling = sampling_from_proto(request.sampling, request.HasField("sampling"))
        except Exception as exc:
            await abort_for(context, exc)
        share, priority = await self._share(context)
        events = self.thread.subscribe(request_id)
        finished = False
        try:
            plan = await self._run(context, lambda m: m.query(session_id, request.question, sampling, request_id,
                                                              request.min_data_version, share, priority))
            if plan.flash is not None:
                for message in self._flash_reply(plan.flash, arrived):
                    yield message
                finished = True
                return
            self.metrics.session_queries.labels("forked").inc()
            yield sessions_pb2.QueryResponse(started=sessions_pb2.QueryStarted(
                data_version=plan.data_version, context_tokens=plan.context_tokens,
                shared_tokens=plan.shared_tokens, request_id=request_id))
            first_token_at, index, text = None, 0, []
            while True:
                item = await events.get()
                if isinstance(item, BaseException):
                    await context.abort(grpc.StatusCode.INTERNAL, f"engine error: {item}")
                if isinstance(item, EngineEvent) and item.kind is EventKind.TOKEN:
                    first_token_at = first_token_at or time.perf_counter()
                    text.append(item.text)
                    yield sessions_pb2.QueryResponse(token=common_pb2.GeneratedToken(
                        id=item.token_id, text=item.text, index=index))
                    index += 1
                elif isinstance(item, RequestSummary):
                    finished = True
                    if item.finish_reason is FinishReason.ABORT and not self.manager.exists(session_id):
                        await context.abort(grpc.StatusCode.ABORTED,
                                            f"session {session_id!r} was closed while the query ran")
                    done = done_to_proto(item, "".join(text)).done
                    now = time.perf_counter()
                    yield sessions_pb2.QueryResponse(done=sessions_pb2.QueryDone(
                        finish_reason=done.finish_reason, text=done.text, data_version=plan.data_version,
                        ttft_ms=((first_token_at or now) - arrived) * 1e3, total_ms=(now - arrived) * 1e3,
                        confidence=item.min_logit_gap or 0.0, stats=done.stats))
                    return
        finally:
            self.thread.unsubscribe(request_id)
            if not finished:
                self.thread.abort_soon(request_id)

    def _flash_reply(self, flash: FlashAnswer, arrived: float) -> list[sessions_pb2.QueryResponse]:
        self.metrics.session_queries.labels("flash").inc()
        elapsed_ms = (time.perf_counter() - arrived) * 1e3
        return [
            sessions_pb2.QueryResponse(started=sessions_pb2.QueryStarted(data_version=flash.data_version,
                                                                         flash_hit=True)),
            sessions_pb2.QueryResponse(done=sessions_pb2.QueryDone(
                finish_reason=FLASH_FINISH, text=flash.answer, data_version=flash.data_version, flash_hit=True,
                ttft_ms=elapsed_ms, total_ms=elapsed_ms, confidence=flash.confidence)),
        ]

    # --- Subscribe --------------------------------------------------------------------------
    async def Subscribe(self, request, context) -> AsyncIterator[sessions_pb2.SubscribeResponse]:
        session_id = request.session_id
        queue: asyncio.Queue = asyncio.Queue()
        self._watchers.setdefault(session_id, set()).add(queue)
        try:
            current = await self._run(context, lambda m: m.current_answers(session_id))
            if request.replay_current:
                for answer in current:
                    yield sessions_pb2.SubscribeResponse(event=event_to_proto(session_id, answer))
            while True:
                event = await queue.get()
                yield sessions_pb2.SubscribeResponse(event=event_to_proto(session_id, event))
                if isinstance(event, SessionClosed):
                    return
        finally:
            watchers = self._watchers.get(session_id)
            if watchers is not None:
                watchers.discard(queue)
                if not watchers:
                    del self._watchers[session_id]

    def _notify(self, session_id: str, event: SessionEvent) -> None:
        """On the engine thread: pass the event to the event loop, which hands it to the subscribers."""
        if isinstance(event, FlashAnswer):
            self.metrics.flash_answers.inc()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):     # the loop has closed
                loop.call_soon_threadsafe(self._deliver, session_id, event)

    def _deliver(self, session_id: str, event: SessionEvent) -> None:
        for queue in self._watchers.get(session_id, ()):
            queue.put_nowait(event)

    @staticmethod
    async def _share(context) -> tuple[Share, int]:
        """The call's tenant and weight, and its priority (0 when it names none)."""
        try:
            share, priority = share_of(context.invocation_metadata())
            return share, priority or 0
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    @staticmethod
    async def _check_id(context, value: str) -> None:
        try:
            check_request_id(value)
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
