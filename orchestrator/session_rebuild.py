"""Rebuilding a session whose replica is lost, and freeing the copy a rebuild leaves behind.

The choice, and why (docs/sessions.md; the statuses: failures.py): the session is created again on
another replica from the session directory — the same id, instructions and retention, each kept
batch ingested again as its own batch (so data versions stay the same), its Flash Queries
registered again. One rebuild at a time per session; a call that finds the session already moved
by another uses the new replica.

The copy a rebuild leaves behind is closed: a replica that stopped answering (SIGSTOP, a stalled
host) may come back holding the session and its KV blocks, which nothing would free. After each
rebuild a background task calls CloseSession on the old replica, waiting for it to be reachable
(`wait_for_ready`) for up to `ORPHAN_CLOSE_WITHIN_S`; a replica that restarted instead answers
NOT_FOUND (nothing to free). Should a later rebuild choose that replica again first, it closes
the old copy there itself before creating the session (else CreateSession would find it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial

import grpc

from orchestrator.failures import peer_wait_s, replica_lost
from orchestrator.lifecycle_store import LifecycleStore
from orchestrator.recording import record_session
from orchestrator.router import NoReplicaAvailable, ReplicaRouter
from orchestrator.session_directory import SessionDirectory, SessionRecord
from orchestrator.tenancy import CallIdentity, current_identity, owner_identity
from protos import common_pb2, sessions_pb2, sessions_pb2_grpc
from servicekit.tenants import Tenants

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 120.0
# How long the orchestrator keeps trying to close the copy of a session left on a replica it
# rebuilt the session away from (each try waits for the replica to be reachable).
ORPHAN_CLOSE_WITHIN_S = 600.0
ORPHAN_CLOSE_TRY_S = 30.0


class ReplicaLost(Exception):
    """The session's replica is gone and no other could take the session."""


class SessionRebuilder:
    def __init__(self, router: ReplicaRouter, directory: SessionDirectory, store: LifecycleStore,
                 stub: Callable[[str], sessions_pb2_grpc.SessionsStub],
                 owner: Callable[[str, CallIdentity | None], CallIdentity] | None = None) -> None:
        self.router = router
        self.directory = directory
        self.store = store
        self.stub = stub                              # the Sessions stub of a replica address
        # the identity a rebuild's replica calls carry: the session's tenant's (tenancy.owner_identity)
        self.owner = owner or partial(owner_identity, Tenants())
        self._rebuilding: dict[str, asyncio.Lock] = {}
        self._orphans: dict[str, set[str]] = {}       # session -> replicas holding an old copy of it
        self._cleanups: set[asyncio.Task] = set()

    async def rebuild(self, record: SessionRecord, cause: grpc.RpcError) -> SessionRecord:
        """Recreate the session on a live replica from the directory (one rebuild at a time per session)."""
        lock = self._rebuilding.setdefault(record.session_id, asyncio.Lock())
        async with lock:
            current = await self.directory.get(record.session_id)
            if current is None:
                raise ReplicaLost(f"session {record.session_id!r} was closed")
            if current.replica != record.replica:      # another call rebuilt it meanwhile
                return current
            owner = current_identity.set(self.owner(current.tenant, current_identity.get()))
            try:                                       # the replica calls are the owner's (its fair share)
                return await self._rebuild(record, current, cause)
            finally:
                current_identity.reset(owner)

    async def _rebuild(self, record: SessionRecord, current: SessionRecord, cause: grpc.RpcError) -> SessionRecord:
        """The rebuild itself (`rebuild` holds the session's lock and the owner's identity)."""
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
                             version, current.tenant)

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
