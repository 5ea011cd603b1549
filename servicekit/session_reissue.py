"""Session calls that survive the orchestrator serving them: the client re-issues them, as it does an Ask.

An orchestrator that dies (or is found frozen by keepalive) ends its calls UNAVAILABLE; every
orchestrator serves every session (the directory is in Redis), so the client sends the call again
and the channel (`servicekit.channels.spread_target`) takes it to a live one:

- `reissued(call)`: a unary or client-streaming call, `call(attempt)` (0 first), sent again while it
  ends UNAVAILABLE, at most `MAX_REISSUES` more times. An `Ingest` re-issue names the data version
  the client had before it (`protos.metadata.INGEST_AFTER_KEY`, the caller's metadata), so the
  orchestrator skips the batches that landed before the break instead of adding them twice;
- `ResumableQuery`: a query's answer stream. Re-issued, the query asks for the data version its
  `started` named, and what the caller already has is not passed on twice (the second `started`,
  each token whose index is below the count received): a greedy answer comes out whole.

Any other status is the call's result. This module knows messages only by their fields (it sits
below `protos`): a query's `request` is a `QueryRequest`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from servicekit.ask_resume import MAX_REISSUES, RESUMABLE

log = logging.getLogger(__name__)
T = TypeVar("T")


def reissued(call: Callable[[int], T], *, max_reissues: int = MAX_REISSUES, what: str = "session call") -> T:
    """`call(attempt)`, sent again while it ends UNAVAILABLE (the orchestrator died under it)."""
    attempt = 0
    while True:
        try:
            return call(attempt)
        except grpc.RpcError as exc:
            if exc.code() not in RESUMABLE or attempt >= max_reissues:
                raise
            attempt += 1
            log.warning("%s broke (%s: %s); re-issuing it (attempt %d)", what, exc.code().name, exc.details(),
                        attempt)


class ResumableQuery:
    """`for response in ResumableQuery(stub.Query-like callable, request)`: `query(request)` opens one
    call (timeout and metadata are the caller's)."""

    def __init__(self, query: Callable[[Any], Any], request: Any, *, max_reissues: int = MAX_REISSUES) -> None:
        self._query = query
        self.request = request
        if not request.request_id:      # a re-issue is the same query in the records
            request.request_id = f"query-{uuid.uuid4().hex[:12]}"
        self.max_reissues = max_reissues
        self.started = False
        self.tokens = 0
        self.attempt = 0

    def __iter__(self) -> Iterator[Any]:
        request = self.request
        while True:
            try:
                for response in self._query(request):
                    kind = response.WhichOneof("kind")
                    if kind == "started":
                        if self.started:
                            continue                     # the caller has it already
                        self.started = True
                        if not request.min_data_version:   # a re-issue asks for the same data
                            request = type(request)()
                            request.CopyFrom(self.request)
                            request.min_data_version = response.started.data_version
                    elif kind == "token":
                        if response.token.index < self.tokens:
                            continue
                        self.tokens += 1
                    yield response
                return
            except grpc.RpcError as exc:
                if exc.code() not in RESUMABLE or self.attempt >= self.max_reissues:
                    raise
                self.attempt += 1
                log.warning("query %s broke (%s: %s) after %d tokens; re-issuing it (attempt %d)",
                            self.request.request_id, exc.code().name, exc.details(), self.tokens, self.attempt)
