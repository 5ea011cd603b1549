"""The orchestrator's `Sessions` service: the same contract as the inference service's, for users.

A session lives on one replica. CreateSession picks it with the router and records it in the
session directory (Redis); every later call reads the directory and is forwarded there. Each
ingest batch is also appended to the directory, and each Flash Query recorded, so the session
can be rebuilt.

Replica failure (the choice, see docs/sessions.md; the statuses and why, failures.py): when the
replica holding a session is unreachable, or answers NOT_FOUND for a session the directory still
holds (it restarted), the session is rebuilt on another replica from the directory and the call
is retried once. A query already streaming its answer is asked again of the same data on the
rebuilt session, no token sent twice (session_query.py); Subscribe resubscribes on the new replica
and carries on. With no replica left, the call ends UNAVAILABLE and says which replica was lost.

The rebuild, and the closing of the copy it leaves behind: session_rebuild.py.

A session is the tenant's that created it (its directory entry records the tenant): another tenant's key
gets NOT_FOUND on it, as for an id that does not exist, and ListSessions lists the caller's tenant's
sessions alone; an admin tenant and the operator reach every session (tenancy.py's `may_read`, the rule
request records follow). A rebuild keeps the tenant, and its calls to the new replica are the owner's.

Every call passes the tenant gate like an Ask (admission.py): the caller's key names its tenant, whose
limits hold (a call takes one of its requests, and a slot while it runs), and the tenant and priority go
with every call to the replica. A Query is gated as an Ask is: its tokens are charged to the tenant,
and one that has not started within the tenant's `max_queue_s` is shed. A Subscribe is counted as a
request when it opens, and holds no slot while it stays open.

Queries are also recorded in the lifecycle store like Asks, through `recording.py` and with the same
event names (`streamrag requests` shows them): a query moved by a rebuild gets an ERROR event naming
both replicas; it ends with DONE and FINISHED, ERROR and FAILED, or CANCELLED. Every write to the
store goes through recording.py. Session events
(CREATED, INGESTED, REBUILT, CLOSED) go to its event stream of `session:<id>`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from orchestrator.admission import TenantGate
from orchestrator.failures import peer_wait_s, session_needs_rebuild
from orchestrator.keeper import AnswerFailed
from orchestrator.lifecycle_store import LifecycleStore, StoreUnavailable
from orchestrator.metrics import OrchestratorMetrics
from orchestrator.recording import (
    abort_failed,
    record_cancelled,
    record_query,
    record_session,
)
from orchestrator.router import NoReplicaAvailable, ReplicaRouter
from orchestrator.session_directory import SessionDirectory, SessionRecord
from orchestrator.session_query import QueryKeeper
from orchestrator.session_rebuild import RPC_TIMEOUT_S, ReplicaLost, SessionRebuilder
from orchestrator.tenancy import current_identity, may_read, owner_identity, reader_scope
from protos import sessions_pb2, sessions_pb2_grpc
from protos.metadata import INGEST_AFTER_KEY
from servicekit.tenants import Tenants

log = logging.getLogger(__name__)

def ingest_after(context: grpc.aio.ServicerContext) -> int | None:
    """A re-issued Ingest's `INGEST_AFTER_KEY` (the data version its caller had); None for a first call."""
    for key, value in context.invocation_metadata() or ():
        if key == INGEST_AFTER_KEY:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def gated(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A unary (or client-streaming) call behind the tenant gate: admitted, a slot held while it runs."""
    @functools.wraps(method)
    async def call(self: SessionsProxy, request, context):
        async with self.gate.admitted(context, "") as admission:
            response = await method(self, request, context)
            admission.answered = True
            return response

    return call


class SessionsProxy(sessions_pb2_grpc.SessionsServicer):
    def __init__(self, router: ReplicaRouter, directory: SessionDirectory, store: LifecycleStore,
                 gate: TenantGate | None = None) -> None:
        self.router = router
        self.directory = directory
        self.store = store
        self.gate = gate or TenantGate(Tenants(), None, OrchestratorMetrics())   # tenants and limits (admission.py)
        self._stubs: dict[str, sessions_pb2_grpc.SessionsStub] = {}
        self.rebuilder = SessionRebuilder(router, directory, store, self.stub,   # session_rebuild.py
                                          functools.partial(owner_identity, self.gate.tenants))

    def stub(self, address: str) -> sessions_pb2_grpc.SessionsStub:
        if address not in self._stubs:
            self._stubs[address] = sessions_pb2_grpc.SessionsStub(self.router.replica(address).channel)
        return self._stubs[address]

    # --- unary calls --------------------------------------------------------------------
    @gated
    async def CreateSession(self, request, context) -> sessions_pb2.CreateSessionResponse:
        session_id = request.session_id or uuid.uuid4().hex[:12]
        try:
            replica = await self.router.choose_ready(f"session:{session_id}",
                                                     wait_s=peer_wait_s(context.time_remaining()))
        except NoReplicaAvailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        caller = current_identity.get()             # set by the gate: the session is its tenant's
        owner = caller.tenant.name if caller is not None else ""
        if not await self._directory(context, self.directory.create(
                session_id, replica.address, request.instructions, request.retention_tokens, owner)):
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"session {session_id!r} already exists")
        create = sessions_pb2.CreateSessionRequest(session_id=session_id, instructions=request.instructions,
                                                   retention_tokens=request.retention_tokens)
        try:
            response = await self.stub(replica.address).CreateSession(create, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            await self._directory(context, self.directory.delete(session_id))
            await context.abort(exc.code(), exc.details() or str(exc))
        await record_session(self.store, session_id, "CREATED", replica=replica.address)
        response.session.replica = replica.address
        return response

    @gated
    async def Ingest(self, request_iterator, context) -> sessions_pb2.IngestResponse:
        """Each batch is forwarded on its own, then kept in the directory for a rebuild. A re-issue
        (`INGEST_AFTER_KEY`: the version the caller had) skips the batches that landed before the break."""
        session_id, batches, segments = "", 0, 0
        response, after, landed = None, ingest_after(context), None
        async for message in request_iterator:
            session_id = session_id or message.session_id
            if not session_id:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first Ingest message must name the session")
            batch = sessions_pb2.IngestRequest(session_id=session_id, segments=message.segments)
            batches, segments = batches + 1, segments + len(batch.segments)
            if after is not None:
                landed = landed or await self._landed(context, session_id)
                after += 1
                if after <= landed[1]:            # this batch reached the replica before the break
                    if after > landed[0]:         # ... but not the directory
                        await self._keep(context, batch, after)
                    response = sessions_pb2.IngestResponse(session_id=session_id, data_version=after)
                    continue
            response = await self._unary(context, session_id, lambda stub, b=batch: stub.Ingest(
                iter([b]), timeout=RPC_TIMEOUT_S), keep=batch)
        if response is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an Ingest call needs at least one message")
        await record_session(self.store, session_id, "INGESTED", batches=batches, segments=segments,
                             data_version=response.data_version)
        response.batches, response.segments = batches, segments
        return response

    async def _landed(self, context, session_id: str) -> tuple[int, int]:
        """A session's data version as the directory keeps it, and as its replica holds it (the
        directory's when the replica cannot say)."""
        record = await self._record(context, session_id)
        try:
            held = (await self.stub(record.replica).DescribeSession(sessions_pb2.DescribeSessionRequest(
                session_id=session_id), timeout=RPC_TIMEOUT_S)).session.data_version
        except (grpc.RpcError, KeyError):
            held = record.data_version
        return record.data_version, max(record.data_version, held)

    @gated
    async def RegisterFlashQuery(self, request, context) -> sessions_pb2.RegisterFlashQueryResponse:
        response = await self._unary(context, request.session_id,
                                     lambda stub: stub.RegisterFlashQuery(request, timeout=RPC_TIMEOUT_S))
        await self._directory(context, self.directory.set_flash(request.session_id, request.question,
                                                                request.max_tokens))
        return response

    @gated
    async def UnregisterFlashQuery(self, request, context) -> sessions_pb2.UnregisterFlashQueryResponse:
        response = await self._unary(context, request.session_id,
                                     lambda stub: stub.UnregisterFlashQuery(request, timeout=RPC_TIMEOUT_S))
        flash = await self._directory(context, self.directory.flash(request.session_id))
        for question in set(flash) - set(response.questions):
            await self._directory(context, self.directory.set_flash(request.session_id, question, None))
        return response

    @gated
    async def DescribeSession(self, request, context) -> sessions_pb2.DescribeSessionResponse:
        response = await self._unary(context, request.session_id,
                                     lambda stub: stub.DescribeSession(request, timeout=RPC_TIMEOUT_S))
        record = await self._record(context, request.session_id)
        response.session.replica = record.replica
        return response

    @gated
    async def ListSessions(self, request, context) -> sessions_pb2.ListSessionsResponse:
        ids = await self._directory(context, self.directory.ids())
        scope = reader_scope(context.invocation_metadata(), self.gate.tenants)
        records = [r for r in await self._directory(context, asyncio.gather(*(self.directory.get(i) for i in ids)))
                   if r is not None and may_read(scope, r.tenant)]      # the caller's tenant's alone

        async def describe(record: SessionRecord) -> sessions_pb2.SessionInfo:
            try:
                info = (await self.stub(record.replica).DescribeSession(
                    sessions_pb2.DescribeSessionRequest(session_id=record.session_id), timeout=10)).session
            except (grpc.RpcError, KeyError) as exc:
                reason = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
                info = sessions_pb2.SessionInfo(session_id=record.session_id, instructions=record.instructions,
                                                data_version=record.data_version, state=f"unreachable: {reason}")
            info.replica = record.replica
            return info

        return sessions_pb2.ListSessionsResponse(sessions=await asyncio.gather(*map(describe, records)))

    @gated
    async def CloseSession(self, request, context) -> sessions_pb2.CloseSessionResponse:
        record = await self._record(context, request.session_id)
        try:
            response = await self.stub(record.replica).CloseSession(request, timeout=RPC_TIMEOUT_S)
        except (grpc.RpcError, KeyError) as exc:   # its replica is gone: the session is gone with it
            log.warning("closing session %s: its replica %s: %s", request.session_id, record.replica, exc)
            response = sessions_pb2.CloseSessionResponse(session=sessions_pb2.SessionInfo(
                session_id=request.session_id))
        await self._directory(context, self.directory.delete(request.session_id))
        await record_session(self.store, request.session_id, "CLOSED", replica=record.replica)
        response.session.replica, response.session.state = record.replica, "closed"
        return response

    # --- streaming calls ----------------------------------------------------------------
    async def Query(self, request, context) -> AsyncIterator[sessions_pb2.QueryResponse]:
        """Forwarded to the session's replica and kept going when it is lost (session_query.py), behind the
        tenant gate as an Ask is."""
        forward = sessions_pb2.QueryRequest()
        forward.CopyFrom(request)
        forward.request_id = request.request_id or f"query-{uuid.uuid4().hex[:12]}"
        async for response in self.gate.serve(context, forward.request_id, self._query(forward, context),
                                              lambda response: response):
            yield response

    async def _query(self, forward: sessions_pb2.QueryRequest, context) -> AsyncIterator[sessions_pb2.QueryResponse]:
        request, request_id = forward, forward.request_id
        record = await self._record(context, request.session_id)
        await record_query(self.store, request_id, request.session_id, request.question, record.replica)
        keeper = QueryKeeper(forward, record, self.store, self.rebuilder)
        outcome = "cancelled"
        try:
            async for response in keeper.responses():
                yield response
            outcome = "answered" if keeper.answered else outcome
        except AnswerFailed as failure:
            outcome = "failed"
            await abort_failed(self.store, context, request_id, failure.code, failure.message)
        finally:
            if outcome == "cancelled" and not keeper.answered:
                await record_cancelled(self.store, request_id)

    async def Subscribe(self, request, context) -> AsyncIterator[sessions_pb2.SubscribeResponse]:
        await self.gate.let_in(context)         # a request of its tenant; no slot held while it stays open
        record = await self._record(context, request.session_id)
        forward = sessions_pb2.SubscribeRequest()
        forward.CopyFrom(request)
        while True:
            try:
                async for event in self.stub(record.replica).Subscribe(forward):
                    yield event
                return
            except grpc.RpcError as exc:
                if not self._needs_rebuild(exc, record):
                    await context.abort(exc.code(), exc.details() or str(exc))
                record = await self._rebuild_or_abort(context, record, exc)
                forward.replay_current = True      # the answers the new replica has, then onwards

    # --- forwarding and rebuilding ------------------------------------------------------
    async def _unary(self, context, session_id: str, call: Callable[[Any], Awaitable[Any]],
                     keep: sessions_pb2.IngestRequest | None = None):
        """Forward one call to the session's replica (rebuilding it once if it is lost). `keep`: an
        ingest batch, recorded in the directory once the replica accepted it."""
        record = await self._record(context, session_id)
        try:
            response = await call(self.stub(record.replica))
        except grpc.RpcError as exc:
            if not self._needs_rebuild(exc, record):
                await context.abort(exc.code(), exc.details() or str(exc))
            if keep is not None:     # the rebuild ingests it with the rest
                await self._keep(context, keep, record.data_version + 1)
            record = await self._rebuild_or_abort(context, record, exc)
            if keep is not None:
                return sessions_pb2.IngestResponse(session_id=session_id, data_version=record.data_version)
            try:
                response = await call(self.stub(record.replica))
            except grpc.RpcError as again:
                await context.abort(again.code(), again.details() or str(again))
        if keep is not None:
            await self._keep(context, keep, response.data_version)
        return response

    async def _keep(self, context, batch: sessions_pb2.IngestRequest, data_version: int) -> None:
        texts = [s.text if s.HasField("text") else "" for s in batch.segments]
        await self._directory(context, self.directory.add_batch(batch.session_id, texts, data_version))

    def _needs_rebuild(self, exc: grpc.RpcError, record: SessionRecord) -> bool:
        """Lost replica, or a replica that no longer knows a session the directory holds (it restarted);
        the statuses and why: failures.py."""
        return session_needs_rebuild(exc.code(), exc.details())

    async def _rebuild_or_abort(self, context, record: SessionRecord, cause: grpc.RpcError) -> SessionRecord:
        try:
            return await self.rebuilder.rebuild(record, cause)
        except ReplicaLost as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def aclose(self) -> None:
        """Stop the background closes (the orchestrator is stopping)."""
        await self.rebuilder.aclose()

    async def _record(self, context, session_id: str) -> SessionRecord:
        if not session_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id must not be empty")
        """The session's directory entry; NOT_FOUND when there is none, or when it is another tenant's the
        caller may not reach (the same answer: ids do not leak; tenancy.py's rule, as for request records)."""
        record = await self._directory(context, self.directory.get(session_id))
        if record is None or not may_read(reader_scope(context.invocation_metadata(), self.gate.tenants),
                                          record.tenant):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id!r}")
        return record

    @staticmethod
    async def _directory(context, awaitable):
        try:
            return await awaitable
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
