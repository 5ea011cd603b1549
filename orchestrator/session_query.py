"""A session query kept going: the keeper's promise (keeper.py) for a query on a session's replica.

The query is forwarded to the replica holding the session and recorded like an Ask (recording.py).
When that replica is lost (the statuses: failures.py), the session is rebuilt on another replica
(session_rebuild.py) and the query asked again there:

- before its first answer message, it is simply asked again, once;
- after it, it is asked again of the same data (`min_data_version`: the version its `started`
  named), and what the caller already has is not sent twice: the second `started` is dropped, and
  each token whose index is below the count sent. A greedy answer is the same answer (one query of
  the same data and question); a sampled one continues with another draw. Up to
  `MAX_CONTINUATIONS` replicas may fail under one answer.

Each call goes to the replica under an id of its own (`<request id>@<hex>`, the caller's id in what
comes back), so a query asked again, here or by a caller that re-issued it to another orchestrator,
never meets the broken call it repeats. Each move is an ERROR event naming both replicas ("session
rebuilt, retrying" before the first message, "session rebuilt, answering again after N tokens" after
it); the query ends with DONE and FINISHED, ERROR and FAILED, or CANCELLED.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import grpc

from orchestrator.failures import session_needs_rebuild
from orchestrator.keeper import MAX_CONTINUATIONS, AnswerFailed
from orchestrator.lifecycle_store import LifecycleStore, StoreUnavailable
from orchestrator.recording import record_finished, record_moved, record_query_started
from orchestrator.session_directory import SessionRecord
from orchestrator.session_rebuild import RPC_TIMEOUT_S, ReplicaLost, SessionRebuilder
from protos import sessions_pb2


class QueryKeeper:
    def __init__(self, request: sessions_pb2.QueryRequest, record: SessionRecord, store: LifecycleStore,
                 rebuilder: SessionRebuilder) -> None:
        self.forward = request            # its request_id set
        self.record = record
        self.store = store
        self.rebuilder = rebuilder
        self.started: sessions_pb2.QueryStarted | None = None
        self.tokens = 0                   # tokens sent to the caller
        self.answered = False

    async def responses(self) -> AsyncIterator[sessions_pb2.QueryResponse]:
        """The answer's messages, each once; `AnswerFailed` when it cannot go on."""
        request_id, rebuilds = self.forward.request_id, 0
        while True:
            # Each call under its own id on the replica: a re-issue must not meet the broken call it repeats
            # (still running there until its cancel arrives, and cancelled by id).
            call = sessions_pb2.QueryRequest()
            call.CopyFrom(self.forward)
            call.request_id = f"{request_id}@{uuid.uuid4().hex[:8]}"
            try:
                async for response in self.rebuilder.stub(self.record.replica).Query(call, timeout=RPC_TIMEOUT_S):
                    if await self._note(response):
                        yield response
                return
            except grpc.RpcError as exc:
                limit = 1 if self.started is None else MAX_CONTINUATIONS     # once before the first message
                if rebuilds >= limit or not session_needs_rebuild(exc.code(), exc.details()):
                    raise AnswerFailed(exc.code(), exc.details() or str(exc)) from exc
                rebuilds += 1
                lost = self.record.replica
                try:
                    self.record = await self.rebuilder.rebuild(self.record, exc)
                except (ReplicaLost, StoreUnavailable) as gone:
                    raise AnswerFailed(grpc.StatusCode.UNAVAILABLE, str(gone)) from exc
                how = "session rebuilt, retrying"
                if self.started is not None:
                    how = f"session rebuilt, answering again after {self.tokens} tokens"
                    self.forward.min_data_version = self.started.data_version      # the same data
                await record_moved(self.store, request_id, lost, self.record.replica, exc.details() or str(exc), how)

    async def _note(self, response: sessions_pb2.QueryResponse) -> bool:
        """Record one message; whether the caller is sent it (not when it has it already)."""
        kind = response.WhichOneof("kind")
        if kind == "started":
            if self.started is not None:
                return False
            response.started.request_id = self.forward.request_id       # the caller's id, not the call's
            self.started = response.started
            await record_query_started(self.store, self.forward.request_id, response.started)
        elif kind == "token":
            if response.token.index < self.tokens:
                return False
            self.tokens += 1
        elif kind == "done":
            self.answered = True
            done = response.done
            await record_finished(self.store, self.forward.request_id, done, ttft_from_question_s=done.ttft_ms / 1e3,
                                  total_s=done.total_ms / 1e3,
                                  noted={"flash_hit": done.flash_hit, "data_version": done.data_version})
        return True
