"""The replay retriever: streams a trace's chunks with their original timing, scaled.

`streamrag serve retriever --kind replay --trace FILE [--time-scale X]` serves a trace
written by `streamrag trace record` or the load-test synthesizer (format: docs/trace-format.md).
Each call replays one of the trace's queries:

1. `options["query_id"]` when given (an id the trace lacks is an `InvalidQuery`);
2. else the query whose text equals the request's (case and spacing ignored);
3. else a deterministic pick by a stable hash of the request's text, so any question gets
   a realistic stream and the same question always gets the same one.

Chunk i is emitted `t_s * time_scale` seconds after the call started (0 emits at once). The
documents are replayed as recorded; `top_k` does not trim them. Sequence numbers, emission
times, the deadline and cancellation are the shared servicer's (retriever_svc/service.py).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from protos import common_pb2, retriever_pb2
from retriever_svc.replay.trace import Trace, TraceChunk, TraceFormatError, TraceQuery, read_trace
from retriever_svc.service import InvalidQuery, RetrievalQuery
from retriever_svc.stability import stability_hints

MODES = {"append": retriever_pb2.CHUNK_MODE_APPEND, "update": retriever_pb2.CHUNK_MODE_UPDATE}


def normalize(text: str) -> str:
    """The form query texts are matched and hashed in: spacing collapsed, case folded."""
    return " ".join(text.split()).casefold()


def stable_index(text: str, n: int) -> int:
    """A pick in [0, n) that depends only on the text (not on Python's per-process hash seed)."""
    digest = hashlib.sha256(normalize(text).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n


def chunk_to_proto(chunk: TraceChunk, previous_update: list[str] | None = None) -> retriever_pb2.ContextChunk:
    """A trace chunk as the `ContextChunk` a retriever streams (seq and emission time left unset).
    An update carries the stability hints of `stability_hints` against the previous update's ids."""
    hints = [None] * len(chunk.documents)
    if chunk.mode == "update":
        hints = stability_hints(previous_update, [d.id for d in chunk.documents], chunk.final)
    out = retriever_pb2.ContextChunk(mode=MODES[chunk.mode], final=chunk.final, documents=[
        common_pb2.Document(id=d.id, title=d.title, url=d.url, text=d.text, score=d.score, source="replay",
                            stability=hint)
        for d, hint in zip(chunk.documents, hints, strict=True)])
    if chunk.stage is not None:
        out.stage.index = chunk.stage.index
        out.stage.search_list_size = chunk.stage.search_list_size
        if chunk.stage.recall_at_k is not None:
            out.stage.recall_at_k = chunk.stage.recall_at_k
    return out


class ReplayBackend:
    """A `RetrieverBackend` over one loaded trace."""

    kind = retriever_pb2.RETRIEVER_KIND_REPLAY
    has_collections = False
    options = frozenset({"query_id"})

    def __init__(self, trace: Trace, *, name: str = "trace", time_scale: float = 1.0) -> None:
        if not (math.isfinite(time_scale) and time_scale >= 0):
            raise ValueError(f"time_scale must be a finite number >= 0, got {time_scale}")
        self.trace, self.name, self.time_scale = trace, name, time_scale
        self._by_id = {q.query_id: q for q in trace.queries}
        self._by_text: dict[str, TraceQuery] = {}
        for q in trace.queries:
            self._by_text.setdefault(normalize(q.query), q)

    def select(self, query: RetrievalQuery) -> TraceQuery:
        """Which of the trace's queries this call replays (rules in the module docstring)."""
        query_id = query.options.get("query_id")
        if query_id is not None:
            if query_id not in self._by_id:
                examples = ", ".join(repr(i) for i in list(self._by_id)[:3])
                raise InvalidQuery(f"unknown query_id {query_id!r}: trace {self.name} has {len(self._by_id)} "
                                   f"queries (e.g. {examples})")
            return self._by_id[query_id]
        found = self._by_text.get(normalize(query.query))
        if found is not None:
            return found
        return self.trace.queries[stable_index(query.query, len(self.trace.queries))]

    async def retrieve(self, query: RetrievalQuery) -> AsyncIterator[retriever_pb2.ContextChunk]:
        record = self.select(query)
        loop = asyncio.get_running_loop()
        started = loop.time()
        previous_update: list[str] | None = None
        for chunk in record.chunks:
            delay = started + chunk.t_s * self.time_scale - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)      # absolute targets: no drift; cancellable
            yield chunk_to_proto(chunk, previous_update)
            if chunk.mode == "update":
                previous_update = [d.id for d in chunk.documents]

    def describe(self) -> retriever_pb2.RetrieverInfo:
        queries = self.trace.queries
        workloads = Counter(q.workload for q in queries)
        sources = Counter(q.source for q in queries)
        documents = {d.id for q in queries for c in q.chunks for d in c.documents}
        header = self.trace.header
        facts = {
            "queries": str(len(queries)),
            "chunks": str(sum(len(q.chunks) for q in queries)),
            "workload_mix": ",".join(f"{name}:{n}" for name, n in sorted(workloads.items())),
            "source_mix": ",".join(f"{name}:{n}" for name, n in sorted(sources.items())),
            "time_scale": f"{self.time_scale:g}",
            "max_duration_s": f"{max(q.duration_s for q in queries):.3f}",
        }
        if header is not None:
            facts.update(format_version=str(header.version), trace_time_scale=f"{header.time_scale:g}",
                         trace_created=header.created, trace_generator=header.generator)
        return retriever_pb2.RetrieverInfo(kind=self.kind, corpus=self.name, num_documents=len(documents),
                                           facts=facts)

    def close(self) -> None:
        """Nothing runs in the background."""


def load_backend(path: str | Path, time_scale: float = 1.0) -> ReplayBackend:
    """Read and validate `path` (TraceFormatError on a bad file) and serve it."""
    return ReplayBackend(read_trace(path), name=Path(path).name, time_scale=time_scale)


def build_backend(args: argparse.Namespace) -> ReplayBackend:
    """For retriever_svc/server.py: the replay backend from `--trace` and `--time-scale`."""
    if args.trace is None:
        raise SystemExit("error: --kind replay needs --trace FILE (a trace from `streamrag trace record`)")
    try:
        return load_backend(args.trace, args.time_scale)
    except TraceFormatError as exc:
        raise SystemExit(f"error: {exc}") from None
    except ValueError as exc:
        raise SystemExit(f"error: --time-scale: {exc}") from None
