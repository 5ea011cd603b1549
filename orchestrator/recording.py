"""What the orchestrator records of a request it proxies to a replica, the same for every proxy
(an Ask, a plain chat or completion, a session's query), so the record reads alike whoever wrote it:

- each engine lifecycle event under its kind's short name ("QUEUED", "SCHEDULED", ...);
- a move off a failed replica: an `ERROR` event naming both replicas, and the record's replica;
- at the end one of: the FINISHED record (answer, first-token time, finish reason, the engine's
  statistics) with a `DONE` event; an `ERROR` event then the FAILED record with the error; a
  `CANCELLED` event and record when the caller went away. The FINISHED record is confirmed stored
  before the answer's last message goes out (up to `TERMINAL_CONFIRM_S`), so an orchestrator killed
  just after the caller saw the answer complete leaves it recorded complete.

Events only a kind of request has are written here too, so every write to the store is in this
module: an Ask's RETRIEVAL_CHUNK, WARNING and retriever change; the keeper's saved prompt and its
RETRIED, RESUMED and CONTINUED events (keeper.py); a query's SESSION_QUERY and STARTED; a session's
CREATED, INGESTED, REBUILT and CLOSED on `session:<id>`. The store (`lifecycle_store.py`) keeps what
it is given; these are the rules of what to give it.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any, NoReturn

import grpc

from orchestrator.lifecycle_store import LifecycleStore, lifecycle_kind_name
from protos import common_pb2, inference_pb2, retriever_pb2, sessions_pb2

# How long a finished answer's last message waits for its record to be stored. Beyond it (Redis
# down or failing over) the answer goes out anyway and the record follows from the store's queue:
# a Redis outage must not hold answers.
TERMINAL_CONFIRM_S = 2.0


async def record_created(store: LifecycleStore, request_id: str, question: str, *, retriever: str, streamed: bool,
                         replica: str) -> None:
    """A new request (state RECEIVED): `retriever` names the retrievers asked ("anns,crawler", "none")."""
    await store.create(request_id, question, retriever=retriever, streamed=streamed, replica=replica)


async def record_retrievers(store: LifecycleStore, request_id: str, retrievers: list[str]) -> None:
    """The retrievers an Ask asks changed (context_warnings.py's fall-back)."""
    await store.update(request_id, retriever=",".join(retrievers) or "none")


async def record_chunk(store: LifecycleStore, request_id: str, source: str, chunk: retriever_pb2.ContextChunk) -> None:
    await store.event(request_id, "RETRIEVAL_CHUNK", source=source, seq=chunk.seq,
                      mode=retriever_pb2.ChunkMode.Name(chunk.mode), docs=len(chunk.documents), final=chunk.final)


async def record_warning(store: LifecycleStore, request_id: str, text: str) -> None:
    await store.event(request_id, "WARNING", detail=text)


async def record_fields(store: LifecycleStore, request_id: str, **fields: str) -> None:
    """More fields of the request's record, read back in `StoredRequest.extra` (the keeper's saved prompt)."""
    await store.update(request_id, **fields)


# Per store: how many answers were kept going, by cause (RETRIED, RESUMED, CONTINUED), for the
# orchestrator's `streamrag_ask_continuations_total` (metrics.py).
_continuations: weakref.WeakKeyDictionary[LifecycleStore, Counter] = weakref.WeakKeyDictionary()


def continuation_counts(store: LifecycleStore) -> Mapping[str, int]:
    """The RETRIED, RESUMED and CONTINUED events recorded through `store` so far, by kind."""
    return _continuations.get(store, Counter())


def _count_continuation(store: LifecycleStore, kind: str) -> None:
    _continuations.setdefault(store, Counter())[kind] += 1


async def record_retried(store: LifecycleStore, request_id: str, attempt: int) -> None:
    """The caller re-issued a request before its first token: it starts again (keeper.py)."""
    _count_continuation(store, "RETRIED")
    await store.event(request_id, "RETRIED", attempt=attempt, tokens=0)


async def record_resumed(store: LifecycleStore, request_id: str, attempt: int, tokens: int, replica: str) -> None:
    """The caller re-issued a request after `tokens` tokens: `replica` continues it (keeper.py)."""
    _count_continuation(store, "RESUMED")
    await store.event(request_id, "RESUMED", attempt=attempt, tokens=tokens, replica=replica)
    await store.update(request_id, state="GENERATING", replica=replica)


async def record_continued(store: LifecycleStore, request_id: str, **fields: Any) -> None:
    """A continuation ended: what it cost (keeper.py)."""
    _count_continuation(store, "CONTINUED")
    await store.event(request_id, "CONTINUED", **fields)


async def record_query(store: LifecycleStore, request_id: str, session_id: str, question: str, replica: str) -> None:
    """A session's query: recorded like an Ask, with a SESSION_QUERY event naming the session."""
    await record_created(store, request_id, question, retriever="none", streamed=True, replica=replica)
    await store.event(request_id, "SESSION_QUERY", session=session_id)


async def record_query_started(store: LifecycleStore, request_id: str, started: sessions_pb2.QueryStarted) -> None:
    await store.event(request_id, "STARTED", data_version=started.data_version, flash_hit=started.flash_hit)


async def record_session(store: LifecycleStore, session_id: str, kind: str, **fields: Any) -> None:
    """An event of the session's own stream, `session:<id>` (CREATED, INGESTED, REBUILT, CLOSED)."""
    await store.event(f"session:{session_id}", kind, **fields)


async def record_lifecycle(store: LifecycleStore, request_id: str, lifecycle: common_pb2.LifecycleEvent) -> None:
    await store.event(request_id, lifecycle_kind_name(lifecycle.kind), detail=lifecycle.detail, count=lifecycle.count)


async def record_tenant(store: LifecycleStore, request_id: str, tenant: str, priority: int) -> None:
    """Who the request is for: its tenant and priority (orchestrator/tenancy.py)."""
    await store.update(request_id, tenant=tenant, priority=priority)


async def record_error(store: LifecycleStore, request_id: str, detail: str, **fields: Any) -> None:
    """Something went wrong that the request may outlive (a retriever, a replica); `fields`: more to keep."""
    await store.event(request_id, "ERROR", **fields, detail=detail)


async def record_moved(store: LifecycleStore, request_id: str, failed: str, chosen: str, reason: str,
                       how: str = "retrying") -> None:
    """The request left the replica `failed` (for `reason`) and goes on on `chosen` (`how`: "retrying",
    "continuing after 5 tokens", ...)."""
    await record_error(store, request_id, f"replica {failed} failed: {reason}; {how} on {chosen}")
    await store.update(request_id, replica=chosen)


async def record_finished(store: LifecycleStore, request_id: str,
                          done: inference_pb2.InferenceDone | sessions_pb2.QueryDone, *, ttft_from_question_s: float,
                          total_s: float, noted: Mapping[str, Any] | None = None, **times_s: float) -> None:
    """The answer is complete: the FINISHED record and its `DONE` event (`times_s`: more timings in
    seconds, such as an Ask's `ttft_from_retrieval_end_s`, kept in both; `noted`: more fields of the
    event alone, such as a query's `flash_hit`)."""
    await store.update(request_id, state="FINISHED", answer=done.text, ttft_from_question_s=ttft_from_question_s,
                       finish_reason=common_pb2.FinishReason.Name(done.finish_reason), stats=done.stats, **times_s)
    await store.event(request_id, "DONE", **(noted or {}), ttft_from_question_s=round(ttft_from_question_s, 4),
                      **{name: round(value, 4) for name, value in times_s.items()}, total_s=round(total_s, 4))
    if store.available:   # with Redis down the answer is not held: the record follows from the queue
        await store.confirm(TERMINAL_CONFIRM_S)


async def record_failed(store: LifecycleStore, request_id: str, message: str) -> None:
    await record_error(store, request_id, message)
    await store.update(request_id, state="FAILED", error=message)


async def abort_failed(store: LifecycleStore, context: grpc.aio.ServicerContext, request_id: str,
                       code: grpc.StatusCode, message: str) -> NoReturn:
    """Record the request FAILED (`record_failed`), then end its call with `code` and `message`."""
    await record_failed(store, request_id, message)
    await context.abort(code, message)
    raise AssertionError("context.abort returned")     # it raises; this tells type checkers so


async def record_cancelled(store: LifecycleStore, request_id: str) -> None:
    """The caller went away before the answer was complete (its KV blocks are freed by the cancel)."""
    await store.event(request_id, "CANCELLED")
    await store.update(request_id, state="CANCELLED")
