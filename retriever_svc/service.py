"""The `Retriever` gRPC servicer shared by every retriever kind.

A retriever kind is a `RetrieverBackend`: it turns a validated query into an async stream
of `ContextChunk`s and describes itself. This module owns everything common: input
validation (empty or oversize query, top-k out of range, unknown options →
INVALID_ARGUMENT), a backend's `RetrieverUnavailable` (→ UNAVAILABLE), the deadline,
cancellation (the backend's generator is closed promptly when the client goes away),
sequence numbers and emission timestamps, and metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from protos import retriever_pb2, retriever_pb2_grpc

MAX_QUERY_CHARS = 2000
MAX_TOP_K = 100
DEFAULT_TOP_K = 10
DEFAULT_DEADLINE_MS = 30_000
MAX_DEADLINE_MS = 600_000


@dataclass(frozen=True)
class RetrievalQuery:
    query: str
    top_k: int
    deadline_s: float                      # seconds from the start of the call
    options: Mapping[str, str] = field(default_factory=dict)
    request_id: str = ""
    collection: str = ""                   # ANNS: the collection to search ("" = the default)


class RetrieverBackend(Protocol):
    kind: int                              # retriever_pb2.RETRIEVER_KIND_*
    options: frozenset[str]                # option names this backend understands
    has_collections: bool                  # whether RetrieveRequest.collection means anything here

    def retrieve(self, query: RetrievalQuery) -> AsyncIterator[retriever_pb2.ContextChunk]:
        """Yield chunks (mode, documents, final, stage); `seq` and `emitted_unix_ms` are filled in here."""
        ...

    def describe(self) -> retriever_pb2.RetrieverInfo: ...

    def close(self) -> None:
        """At shutdown, after the server stopped: stop what the backend runs in the background."""
        ...


class InvalidQuery(ValueError):
    """Malformed input: INVALID_ARGUMENT."""


class RetrieverUnavailable(RuntimeError):
    """Something the backend depends on (e.g. the crawler's site search, an index still building) cannot serve
    this query now: UNAVAILABLE."""


class UnknownCollection(LookupError):
    """NOT_FOUND."""


class CollectionExists(ValueError):
    """ALREADY_EXISTS."""


class CollectionReadOnly(RuntimeError):
    """The request cannot apply to this collection as it is (the bundled default): FAILED_PRECONDITION."""


# The one error -> status map of the retriever service (both servicers use it).
STATUS_FOR: dict[type[Exception], grpc.StatusCode] = {
    InvalidQuery: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownCollection: grpc.StatusCode.NOT_FOUND,
    CollectionExists: grpc.StatusCode.ALREADY_EXISTS,
    CollectionReadOnly: grpc.StatusCode.FAILED_PRECONDITION,
    RetrieverUnavailable: grpc.StatusCode.UNAVAILABLE,
}
RetrieverError = (InvalidQuery, UnknownCollection, CollectionExists, CollectionReadOnly, RetrieverUnavailable)


def status_for(exc: Exception) -> grpc.StatusCode:
    return next(code for kind, code in STATUS_FOR.items() if isinstance(exc, kind))


def error_message(exc: BaseException) -> str:
    """A LookupError's str() is its repr; every other error's is its message."""
    return exc.args[0] if isinstance(exc, LookupError) and exc.args else str(exc)


def validate(request: retriever_pb2.RetrieveRequest, backend: RetrieverBackend) -> RetrievalQuery:
    query = request.query.strip()
    if not query:
        raise InvalidQuery("query must not be empty")
    if len(request.query) > MAX_QUERY_CHARS:
        raise InvalidQuery(f"query is {len(request.query)} characters; the limit is {MAX_QUERY_CHARS}")
    top_k = request.top_k or DEFAULT_TOP_K
    if not 1 <= top_k <= MAX_TOP_K:
        raise InvalidQuery(f"top_k must be in [1, {MAX_TOP_K}], got {request.top_k}")
    deadline_ms = request.deadline_ms or DEFAULT_DEADLINE_MS
    if not 1 <= deadline_ms <= MAX_DEADLINE_MS:
        raise InvalidQuery(f"deadline_ms must be in [1, {MAX_DEADLINE_MS}], got {request.deadline_ms}")
    unknown = set(request.options) - backend.options
    if unknown:
        known = ", ".join(sorted(backend.options)) or "none"
        raise InvalidQuery(f"unknown options {sorted(unknown)}; this retriever understands: {known}")
    if request.collection and not backend.has_collections:
        raise InvalidQuery(f"this retriever has no collections; {request.collection!r} applies to the ANNS retriever")
    return RetrievalQuery(query, top_k, deadline_ms / 1000, dict(request.options), request.request_id,
                          request.collection)


class RetrieverMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.chunks = Counter("streamrag_retriever_chunks", "Chunks emitted", ["mode"], registry=self.registry)
        self.first_chunk = Histogram("streamrag_retriever_first_chunk_seconds", "Time to the first chunk",
                                     registry=self.registry)
        self.duration = Histogram("streamrag_retriever_seconds", "Whole retrieval time", registry=self.registry)
        self.errors = Counter("streamrag_retriever_errors", "Retrievals ended with an error", ["code"],
                              registry=self.registry)


class RetrieverServicer(retriever_pb2_grpc.RetrieverServicer):
    def __init__(self, backend: RetrieverBackend, metrics: RetrieverMetrics | None = None) -> None:
        self.backend = backend
        self.metrics = metrics or RetrieverMetrics()

    async def Retrieve(self, request, context) -> AsyncIterator[retriever_pb2.RetrieveResponse]:
        try:
            query = validate(request, self.backend)
        except InvalidQuery as exc:
            await self._abort(context, exc)
        started = time.monotonic()
        seq = 0
        chunks = self.backend.retrieve(query)
        deadline = asyncio.get_running_loop().time() + query.deadline_s
        try:
            while True:
                # The deadline bounds the wait for the backend's next chunk, never the `yield`: a
                # cancellation landing while gRPC writes a response would escape the timeout and
                # leave the call without its final chunk.
                try:
                    async with asyncio.timeout_at(deadline):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                chunk.seq = seq
                chunk.emitted_unix_ms = int(time.time() * 1000)
                if seq == 0:
                    self.metrics.first_chunk.observe(time.monotonic() - started)
                self.metrics.chunks.labels(retriever_pb2.ChunkMode.Name(chunk.mode)).inc()
                seq += 1
                yield retriever_pb2.RetrieveResponse(chunk=chunk)
                if chunk.final:
                    break
        except TimeoutError:
            # The deadline passed: what was emitted stands. An empty APPEND marks the end without
            # changing the caller's document list in either mode.
            yield retriever_pb2.RetrieveResponse(chunk=retriever_pb2.ContextChunk(
                seq=seq, mode=retriever_pb2.CHUNK_MODE_APPEND, final=True, emitted_unix_ms=int(time.time() * 1000)))
        except RetrieverError as exc:   # what only the backend can judge (an unknown collection or query_id)
            await self._abort(context, exc)
        finally:
            await chunks.aclose()
            self.metrics.duration.observe(time.monotonic() - started)

    async def _abort(self, context, exc: Exception) -> None:
        code = status_for(exc)
        self.metrics.errors.labels(code.name).inc()
        await context.abort(code, error_message(exc))

    async def Describe(self, request, context) -> retriever_pb2.RetrieverDescribeResponse:
        return retriever_pb2.RetrieverDescribeResponse(retriever_info=self.backend.describe())
