"""The orchestrator's `Sessions` service: the same contract as the inference service's, for users.

A session lives on one replica. CreateSession picks it with the router and records it in the
session directory (Redis); every later call reads the directory and is forwarded there. Each
ingest batch is also appended to the directory, and each Flash Query recorded, so the session
can be rebuilt.

Replica failure (the choice, see docs/sessions.md; the statuses and why, failures.py): when the
replica holding a session is unreachable, or answers NOT_FOUND for a session the directory still
holds (it restarted), the session is rebuilt on another replica from the directory — created
again with the same id, instructions and retention, each kept batch ingested again as its own
batch (so data versions stay the same), its Flash Queries registered again — and the call is
retried once. A query already streaming its answer when the replica dies ends UNAVAILABLE (no
token is sent twice); Subscribe resubscribes on the new replica and carries on. With no replica
left, the call ends UNAVAILABLE and says which replica was lost.

The copy a rebuild leaves behind is closed: a replica that stopped answering (SIGSTOP, a stalled
host) may come back holding the session and its KV blocks, which nothing would free. After each
rebuild a background task calls CloseSession on the old replica, waiting for it to be reachable
(`wait_for_ready`) for up to `ORPHAN_CLOSE_WITHIN_S`; a replica that restarted instead answers
NOT_FOUND (nothing to free). Should a later rebuild choose that replica again first, it closes
the old copy there itself before creating the session (else CreateSession would find it).

Queries are also recorded in the lifecycle store like Asks, through `recording.py` and with the same
event names (`streamrag requests` shows them): a query moved by a rebuild gets an ERROR event naming
both replicas; it ends with DONE and FINISHED, ERROR and FAILED, or CANCELLED. Session events
(CREATED, INGESTED, REBUILT, CLOSED) go to its event stream of `session:<id>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from orchestrator.failures import peer_wait_s, replica_lost, session_needs_rebuild
from orchestrator.lifecycle_store import LifecycleStore, StoreUnavailable
from orchestrator.recording import (
    abort_failed,
    record_cancelled,
    record_finished,
    record_moved,
    record_query,
    record_query_started,
    record_session,
)
from orchestrator.router import NoReplicaAvailable, ReplicaRouter
from orchestrator.session_directory import SessionDirectory, SessionRecord
from protos import common_pb2, sessions_pb2, sessions_pb2_grpc

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 120.0
# How long the orchestrator keeps trying to close the copy of a session left on a replica it
# rebuilt the session away from (each try waits for the replica to be reachable).
ORPHAN_CLOSE_WITHIN_S = 600.0
ORPHAN_CLOSE_TRY_S = 30.0


class ReplicaLost(Exception):
    """The session's replica is gone and no other could take the session."""


class SessionsProxy(sessions_pb2_grpc.SessionsServicer):
    def __init__(self, router: ReplicaRouter, directory: SessionDirectory, store: LifecycleStore) -> None:
        self.router = router
        self.directory = directory
        self.store = store
        self._stubs: dict[str, sessions_pb2_grpc.SessionsStub] = {}
        self._rebuilding: dict[str, asyncio.Lock] = {}
        self._orphans: dict[str, set[str]] = {}       # session -> replicas holding an old copy of it
        self._cleanups: set[asyncio.Task] = set()

    def stub(self, address: str) -> sessions_pb2_grpc.SessionsStub:
        if address not in self._stubs:
            self._stubs[address] = sessions_pb2_grpc.SessionsStub(self.router.replica(address).channel)
        return self._stubs[address]

    # --- unary calls --------------------------------------------------------------------
    async def CreateSession(self, request, context) -> sessions_pb2.CreateSessionResponse:
        session_id = request.session_id or uuid.uuid4().hex[:12]
        try:
            replica = await self.router.choose_ready(f"session:{session_id}",
                                                     wait_s=peer_wait_s(context.time_remaining()))
        except NoReplicaAvailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        if not await self._directory(context, self.directory.create(
                session_id, replica.address, request.instructions, request.retention_tokens)):
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

    async def Ingest(self, request_iterator, context) -> sessions_pb2.IngestResponse:
        """Each batch is forwarded on its own, then kept in the directory for a rebuild."""
        session_id, batches, segments = "", 0, 0
        response = None
        async for message in request_iterator:
            session_id = session_id or message.session_id
            if not session_id:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first Ingest message must name the session")
            batch = sessions_pb2.IngestRequest(session_id=session_id, segments=message.segments)
            response = await self._unary(context, session_id, lambda stub, b=batch: stub.Ingest(
                iter([b]), timeout=RPC_TIMEOUT_S), keep=batch)
            batches, segments = batches + 1, segments + len(batch.segments)
        if response is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an Ingest call needs at least one message")
        await record_session(self.store, session_id, "INGESTED", batches=batches, segments=segments,
                             data_version=response.data_version)
        response.batches, response.segments = batches, segments
        return response

    async def RegisterFlashQuery(self, request, context) -> sessions_pb2.RegisterFlashQueryResponse:
        response = await self._unary(context, request.session_id,
                                     lambda stub: stub.RegisterFlashQuery(request, timeout=RPC_TIMEOUT_S))
        await self._directory(context, self.directory.set_flash(request.session_id, request.question,
                                                                request.max_tokens))
        return response

    async def UnregisterFlashQuery(self, request, context) -> sessions_pb2.UnregisterFlashQueryResponse:
        response = await self._unary(context, request.session_id,
                                     lambda stub: stub.UnregisterFlashQuery(request, timeout=RPC_TIMEOUT_S))
        flash = await self._directory(context, self.directory.flash(request.session_id))
        for question in set(flash) - set(response.questions):
            await self._directory(context, self.directory.set_flash(request.session_id, question, None))
        return response

    async def DescribeSession(self, request, context) -> sessions_pb2.DescribeSessionResponse:
        response = await self._unary(context, request.session_id,
                                     lambda stub: stub.DescribeSession(request, timeout=RPC_TIMEOUT_S))
        record = await self._record(context, request.session_id)
        response.session.replica = record.replica
        return response

    async def ListSessions(self, request, context) -> sessions_pb2.ListSessionsResponse:
        ids = await self._directory(context, self.directory.ids())
        records = [r for r in await asyncio.gather(*(self.directory.get(i) for i in ids)) if r is not None]

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
        """Forwarded to the session's replica and recorded like an Ask (recording.py); a replica lost
        before the first answer message moves the query once, after rebuilding the session."""
        request_id = request.request_id or f"query-{uuid.uuid4().hex[:12]}"
        forward = sessions_pb2.QueryRequest()
        forward.CopyFrom(request)
        forward.request_id = request_id
        record = await self._record(context, request.session_id)
        await record_query(self.store, request_id, request.session_id, request.question, record.replica)
        outcome, sent = "cancelled", False
        try:
            for attempt in (0, 1):
                try:
                    async for response in self.stub(record.replica).Query(forward, timeout=RPC_TIMEOUT_S):
                        sent = True
                        kind = response.WhichOneof("kind")
                        if kind == "started":
                            await record_query_started(self.store, request_id, response.started)
                        elif kind == "done":
                            outcome = "answered"
                            await self._record_done(request_id, response.done)
                        yield response
                    return
                except grpc.RpcError as exc:
                    if attempt or sent or not self._needs_rebuild(exc, record):
                        outcome = "failed"
                        await abort_failed(self.store, context, request_id, exc.code(), exc.details() or str(exc))
                    lost = record.replica
                    try:
                        record = await self.rebuild(record, exc)
                    except (ReplicaLost, StoreUnavailable) as gone:
                        outcome = "failed"
                        await abort_failed(self.store, context, request_id, grpc.StatusCode.UNAVAILABLE, str(gone))
                    await record_moved(self.store, request_id, lost, record.replica, exc.details() or str(exc),
                                       "session rebuilt, retrying")
        finally:
            if outcome == "cancelled":
                await record_cancelled(self.store, request_id)

    async def Subscribe(self, request, context) -> AsyncIterator[sessions_pb2.SubscribeResponse]:
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
            return await self.rebuild(record, cause)
        except ReplicaLost as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def rebuild(self, record: SessionRecord, cause: grpc.RpcError) -> SessionRecord:
        """Recreate the session on a live replica from the directory (one rebuild at a time per session)."""
        lock = self._rebuilding.setdefault(record.session_id, asyncio.Lock())
        async with lock:
            current = await self.directory.get(record.session_id)
            if current is None:
                raise ReplicaLost(f"session {record.session_id!r} was closed")
            if current.replica != record.replica:      # another call rebuilt it meanwhile
                return current
            if replica_lost(cause.code()):
                self.router.mark_failed(record.replica, f"session call failed: {cause.details()}")
            try:   # another replica first; with none, the first that is (back) within the wait (failures.py)
                replica = self.router.choose(f"session:{record.session_id}",
                                             exclude={record.replica} if replica_lost(cause.code()) else set())
            except NoReplicaAvailable:
                replica = None
            try:
                replica = replica or await self.router.choose_ready(f"session:{record.session_id}",
                                                                    wait_s=peer_wait_s(None))
            except NoReplicaAvailable as exc:
                raise ReplicaLost(f"session {record.session_id!r}: its replica {record.replica} is lost "
                                  f"({cause.details()}) and no replica can take it over: {exc}") from exc
            stub = self.stub(replica.address)
            if replica.address in self._orphans.get(record.session_id, ()):   # back, with an old copy
                await self._close_orphan_now(record.session_id, replica.address)
            batches = await self.directory.batches(record.session_id)
            try:
                await stub.CreateSession(sessions_pb2.CreateSessionRequest(
                    session_id=record.session_id, instructions=record.instructions,
                    retention_tokens=record.retention_tokens), timeout=RPC_TIMEOUT_S)
                version = 0
                if batches:
                    version = (await stub.Ingest(iter([
                        sessions_pb2.IngestRequest(session_id=record.session_id,
                                                   segments=[common_pb2.Segment(text=t) for t in batch])
                        for batch in batches]), timeout=RPC_TIMEOUT_S)).data_version
                for question, max_tokens in (await self.directory.flash(record.session_id)).items():
                    await stub.RegisterFlashQuery(sessions_pb2.RegisterFlashQueryRequest(
                        session_id=record.session_id, question=question, max_tokens=max_tokens),
                        timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                if replica_lost(exc.code()):
                    self.router.mark_failed(replica.address, f"session rebuild failed: {exc.details()}")
                with contextlib.suppress(grpc.RpcError):   # leave nothing half-built behind
                    await stub.CloseSession(sessions_pb2.CloseSessionRequest(session_id=record.session_id),
                                            timeout=10)
                raise ReplicaLost(f"session {record.session_id!r}: its replica {record.replica} is lost "
                                  f"({cause.details()}); rebuilding it on {replica.address} failed: "
                                  f"{exc.details()}") from exc
            await self.directory.set_replica(record.session_id, replica.address)
            await record_session(self.store, record.session_id, "REBUILT", lost=record.replica,
                                 replica=replica.address, batches=len(batches), cause=cause.details())
            log.warning("session %s rebuilt on %s (%d batches) after %s: %s", record.session_id, replica.address,
                        len(batches), record.replica, cause.details())
            self._orphans.setdefault(record.session_id, set()).add(record.replica)
            task = asyncio.get_running_loop().create_task(self._close_orphan(record.session_id, record.replica))
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)
            return SessionRecord(record.session_id, replica.address, record.instructions, record.retention_tokens,
                                 version)

    async def _close_orphan(self, session_id: str, address: str) -> None:
        """In the background, after a rebuild: close the copy of the session left on `address` once
        that replica answers again (waiting up to ORPHAN_CLOSE_WITHIN_S), so its KV blocks are freed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ORPHAN_CLOSE_WITHIN_S
        while address in self._orphans.get(session_id, ()):
            left = deadline - loop.time()
            if left <= 0:
                log.warning("session %s: could not close its old copy on %s within %g s", session_id, address,
                            ORPHAN_CLOSE_WITHIN_S)
                self._forget_orphan(session_id, address)
                return
            try:   # waits for the replica first; a frozen one holds the call until the try's deadline
                await self.stub(address).DescribeSession(sessions_pb2.DescribeSessionRequest(session_id=session_id),
                                                         timeout=min(ORPHAN_CLOSE_TRY_S, left), wait_for_ready=True)
            except KeyError:          # the replica left the router: nothing to reach
                self._forget_orphan(session_id, address)
                return
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    await asyncio.sleep(min(1.0, max(0.0, deadline - loop.time())))
                    continue
                # NOT_FOUND: it restarted without the session; anything else: the replica is back
            async with self._rebuilding.setdefault(session_id, asyncio.Lock()):   # not while a rebuild runs
                if address not in self._orphans.get(session_id, ()):    # a rebuild onto it closed it
                    return
                await self._close_orphan_now(session_id, address)

    async def _close_orphan_now(self, session_id: str, address: str) -> None:
        """Close the old copy of the session on `address` (which answers) unless the session lives there."""
        current = await self.directory.get(session_id)
        if current is None or current.replica != address:
            try:
                await self.stub(address).CloseSession(sessions_pb2.CloseSessionRequest(session_id=session_id),
                                                      timeout=ORPHAN_CLOSE_TRY_S)
                log.info("session %s: closed its old copy on %s", session_id, address)
            except (grpc.RpcError, KeyError) as exc:      # NOT_FOUND: already gone
                log.info("session %s: closing its old copy on %s: %s", session_id, address, exc)
        self._forget_orphan(session_id, address)

    def _forget_orphan(self, session_id: str, address: str) -> None:
        held = self._orphans.get(session_id)
        if held is not None:
            held.discard(address)
            if not held:
                del self._orphans[session_id]

    async def aclose(self) -> None:
        """Stop the background closes (the orchestrator is stopping)."""
        for task in list(self._cleanups):
            task.cancel()
        await asyncio.gather(*self._cleanups, return_exceptions=True)

    async def _record(self, context, session_id: str) -> SessionRecord:
        if not session_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id must not be empty")
        record = await self._directory(context, self.directory.get(session_id))
        if record is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id!r}")
        return record

    @staticmethod
    async def _directory(context, awaitable):
        try:
            return await awaitable
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _record_done(self, request_id: str, done: sessions_pb2.QueryDone) -> None:
        await record_finished(self.store, request_id, done, ttft_from_question_s=done.ttft_ms / 1e3,
                              total_s=done.total_ms / 1e3,
                              noted={"flash_hit": done.flash_hit, "data_version": done.data_version})
