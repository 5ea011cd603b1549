"""The `Orchestrator` gRPC servicer: Ask (the pipeline in ask.py), and GetRequest and ListRequests
(the lifecycle store's records, read from Redis: clients such as `streamrag requests` open no Redis).

A caller reads only its tenant's records (tenancy.py's `reader_scope`): another tenant's request is
NOT_FOUND, as one that does not exist (so ids do not leak), and a list holds the caller's tenant's
requests alone. An admin tenant and the operator read every tenant's."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc

from orchestrator.admission import TenantGate
from orchestrator.ask import AskFailed, AskPipeline, BadAsk, validate_ask
from orchestrator.chat_formats import ChatFormats
from orchestrator.lifecycle_store import StoreUnavailable, to_proto
from orchestrator.metrics import OrchestratorMetrics
from orchestrator.recording import abort_failed
from orchestrator.router import NoReplicaAvailable
from orchestrator.tenancy import may_read, reader_scope
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.tenants import Tenants

log = logging.getLogger(__name__)
T = TypeVar("T")

LIST_LIMIT_DEFAULT = 20      # ListRequests with limit 0


def list_limit(requested: int, most: int) -> int:
    """How many records a ListRequests returns: `requested`, or the default for 0; a ValueError (the
    message for the caller) outside 0..`most` (the store's index of recent requests holds no more)."""
    if not 0 <= requested <= most:
        raise ValueError(f"limit must be between 0 and {most} (0: {LIST_LIMIT_DEFAULT}), got {requested}")
    return requested or LIST_LIMIT_DEFAULT


class OrchestratorServicer(orchestrator_pb2_grpc.OrchestratorServicer):
    def __init__(self, router, retriever_stubs: dict, store, metrics: OrchestratorMetrics | None = None,
                 gate: TenantGate | None = None) -> None:
        self.router = router
        self.retriever_stubs = retriever_stubs
        self.store = store
        self.metrics = metrics or OrchestratorMetrics()
        self.chat_format = ChatFormats()      # each replica's, asked once (Describe)
        self.gate = gate or TenantGate(Tenants(), None, self.metrics)   # tenants and their limits (admission.py)

    async def Ask(self, request, context) -> AsyncIterator[orchestrator_pb2.AskResponse]:
        if not request.request_id and not request.HasField("resume"):   # named here, so that the gate records
            # the tenant under it (a resume without its request's id is refused by validate_ask)
            request.request_id = uuid.uuid4().hex
        async for response in self.gate.serve(context, request.request_id, self._ask(request, context),
                                              lambda response: response.event, resumed=request.HasField("resume")):
            yield response

    async def _ask(self, request, context) -> AsyncIterator[orchestrator_pb2.AskResponse]:
        try:
            settings = validate_ask(request, set(self.retriever_stubs))
        except BadAsk as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        pipeline = AskPipeline(settings, self.router, self.retriever_stubs, self.store, self.chat_format,
                               time_remaining=context.time_remaining)
        mode = "streaming" if settings.streamed else "baseline"
        outcome = "cancelled"
        try:
            async for event in pipeline.run():
                if event.WhichOneof("kind") == "done":
                    outcome = "answered"
                    self._observe(mode, event.done)
                yield orchestrator_pb2.AskResponse(event=event)
        except NoReplicaAvailable as exc:
            outcome = "failed"
            await abort_failed(self.store, context, settings.request_id, grpc.StatusCode.UNAVAILABLE, str(exc))
        except AskFailed as exc:
            outcome = "failed"
            await abort_failed(self.store, context, settings.request_id, exc.code, exc.message)
        except grpc.RpcError as exc:   # e.g. Describe on a dead replica
            outcome = "failed"
            await abort_failed(self.store, context, settings.request_id, grpc.StatusCode.UNAVAILABLE,
                               exc.details() or str(exc))
        finally:
            self.metrics.asks.labels(mode, outcome).inc()

    def _observe(self, mode: str, done: orchestrator_pb2.AskDone) -> None:
        self.metrics.ttft_question.labels(mode).observe(done.ttft_from_question_s)
        self.metrics.ttft_retrieval.labels(mode).observe(done.ttft_from_retrieval_end_s)
        self.metrics.retrieval.labels(mode).observe(done.retrieval_s)

    async def GetRequest(self, request, context) -> orchestrator_pb2.GetRequestResponse:
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id must not be empty")
        scope = reader_scope(context.invocation_metadata(), self.gate.tenants)
        stored = await self._read(context, self.store.get(request.request_id))
        if stored is None or not may_read(scope, stored.extra.get("tenant", "")):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no request {request.request_id!r}")
        return orchestrator_pb2.GetRequestResponse(record=to_proto(stored))

    async def ListRequests(self, request, context) -> orchestrator_pb2.ListRequestsResponse:
        try:
            limit = list_limit(request.limit, self.store.recent_max)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        scope = reader_scope(context.invocation_metadata(), self.gate.tenants)
        tenant = request.tenant if scope is None else scope
        if scope is not None and request.tenant not in ("", scope):
            return orchestrator_pb2.ListRequestsResponse()          # another tenant's: none the caller may read
        if tenant or scope is not None:          # the tenant's among the newest the index holds
            stored = await self._read(context, self.store.recent(self.store.recent_max))
            stored = [r for r in stored if r.extra.get("tenant", "") == tenant][:limit]
        else:
            stored = await self._read(context, self.store.recent(limit))
        return orchestrator_pb2.ListRequestsResponse(records=[to_proto(r) for r in stored])

    @staticmethod
    async def _read(context, reading: Awaitable[T]) -> T:
        """What the store read; the call ends UNAVAILABLE when Redis cannot be reached."""
        try:
            return await reading
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the lifecycle store is unavailable: {exc}")
