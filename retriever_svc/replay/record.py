"""`streamrag trace record`: record what a running Retriever streams into a trace file.

    streamrag trace record --retriever 127.0.0.1:50061 --queries questions.txt "what is a generator?" \\
        --out traces/anns.jsonl [--top-k 10] [--workload anns]

Queries run one at a time (concurrent calls would distort the timing being recorded). Each
chunk is stored with its arrival time relative to the start of its call, its mode, stage and
documents (docs/trace-format.md). One progress line per query goes to stderr; the file is
flushed per query. A query whose call fails is reported and left out (exit status 1).

The argparse wiring (`add_trace_record_args`, `run_trace_record`) imports nothing heavy, so
`streamrag --help` stays instant; gRPC is imported when the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from retriever_svc.replay.trace import (
    TraceChunk,
    TraceDocument,
    TraceHeader,
    TraceQuery,
    TraceStage,
    TraceWriter,
    check_query,
)
from servicekit.progress import say

if TYPE_CHECKING:
    from protos import retriever_pb2

Say = Callable[[str], None]


@dataclass(frozen=True)
class QueryToRecord:
    query_id: str
    query: str


@dataclass(frozen=True)
class RecordResult:
    recorded: int
    failed: int


def add_trace_record_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--retriever", required=True, metavar="ADDR",
                        help="host:port of a running Retriever (any kind)")
    parser.add_argument("--queries", required=True, nargs="+", metavar="FILE_OR_QUERY",
                        help="query files (one query per line, or JSON lines with \"query\" and optional "
                             "\"query_id\", e.g. another trace) or the query text itself")
    parser.add_argument("--out", required=True, type=Path, help="trace file to write (JSON lines)")
    parser.add_argument("--top-k", type=int, default=0, help="documents per query (0: the retriever's default)")
    parser.add_argument("--deadline-ms", type=int, default=0, help="per-query deadline (0: the retriever's default)")
    parser.add_argument("--workload", default=None, help="workload label (default: the retriever's kind)")



def run_trace_record(args: argparse.Namespace) -> int:
    """Entry point for `streamrag trace record`: 0 all recorded, 1 some failed, 2 bad arguments."""
    try:
        queries = load_queries(args.queries)
    except (OSError, ValueError) as exc:
        say(f"error: {exc}")
        return 2
    if not queries:
        say("error: no queries given")
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = asyncio.run(record_trace(args.retriever, queries, args.out, top_k=args.top_k,
                                          deadline_ms=args.deadline_ms, workload=args.workload))
    except ConnectionError as exc:
        say(f"error: {exc}")
        return 1
    say(f"wrote {result.recorded} queries to {args.out}"
                + (f"; {result.failed} failed and were left out" if result.failed else ""))
    return 1 if result.failed else 0


def load_queries(items: Sequence[str]) -> list[QueryToRecord]:
    """Queries from files (plain lines, `#` comments, or JSON objects with "query") or inline texts."""
    given: list[tuple[str | None, str]] = []
    for item in items:
        path = Path(item)
        if not path.is_file():
            given.append((None, item))
            continue
        for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if not line.startswith("{"):
                given.append((None, line))
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON: {exc.msg}") from None
            if "query" not in obj and "format" in obj:
                continue                                    # a trace's header line
            if not isinstance(obj.get("query"), str) or not obj["query"].strip():
                raise ValueError(f"{path}:{number}: a JSON line needs a non-empty string \"query\"")
            given.append((obj.get("query_id") or None, obj["query"]))
    explicit = [str(qid) for qid, _ in given if qid is not None]
    used = set(explicit)
    if len(used) < len(explicit):
        raise ValueError("the query files repeat a query_id")
    out, n = [], 0
    for qid, text in given:
        if qid is None:                                     # number the rest q0001, q0002, ... around given ids
            n += 1
            while f"q{n:04d}" in used:
                n += 1
            qid = f"q{n:04d}"
        out.append(QueryToRecord(str(qid), text))
    return out


def chunk_from_proto(chunk: retriever_pb2.ContextChunk, t_s: float) -> TraceChunk:
    """A received `ContextChunk` as a trace chunk that arrived `t_s` seconds into its call."""
    from protos import retriever_pb2

    stage = None
    if chunk.HasField("stage"):
        recall = chunk.stage.recall_at_k if chunk.stage.HasField("recall_at_k") else None
        stage = TraceStage(chunk.stage.index, chunk.stage.search_list_size, recall)
    mode = "update" if chunk.mode == retriever_pb2.CHUNK_MODE_UPDATE else "append"
    documents = tuple(TraceDocument(d.id, d.title, d.url, d.text, d.score) for d in chunk.documents)
    return TraceChunk(round(t_s, 6), mode, chunk.final, documents, stage)


async def record_query(stub, item: QueryToRecord, *, workload: str, top_k: int = 0,
                       deadline_ms: int = 0) -> TraceQuery:
    """Call Retrieve once and return what arrived; ValueError unless exactly the last chunk is final."""
    from protos import retriever_pb2

    request = retriever_pb2.RetrieveRequest(query=item.query, top_k=top_k, deadline_ms=deadline_ms,
                                            request_id=f"trace-record-{item.query_id}")
    chunks: list[TraceChunk] = []
    started = time.monotonic()
    async for response in stub.Retrieve(request):
        chunks.append(chunk_from_proto(response.chunk, time.monotonic() - started))
    if not chunks or not chunks[-1].final:
        raise ValueError(f"the stream ended after {len(chunks)} chunk(s) without a final chunk")
    query = TraceQuery(item.query_id, item.query, workload, "recorded", tuple(chunks))
    check_query(query)                                      # e.g. chunks after the final one
    return query


def _progress(i: int, n: int, q: TraceQuery) -> str:
    appends = sum(c.mode == "append" for c in q.chunks)
    docs = sum(len(c.documents) for c in q.chunks)
    text = q.query if len(q.query) <= 50 else q.query[:47] + "..."
    return (f"[{i}/{n}] {q.query_id}: {len(q.chunks)} chunks ({appends} append, {len(q.chunks) - appends} update), "
            f"{docs} documents, first {q.chunks[0].t_s:.2f} s, final {q.duration_s:.2f} s  {text!r}")


async def record_trace(address: str, queries: Sequence[QueryToRecord], out: Path, *, top_k: int = 0,
                       deadline_ms: int = 0, workload: str | None = None, say: Say = say) -> RecordResult:
    """Record every query against the Retriever at `address` into `out`; ConnectionError if it cannot be reached."""
    import grpc

    from protos import retriever_pb2, retriever_pb2_grpc
    from servicekit.server import MAX_MESSAGE_BYTES

    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = retriever_pb2_grpc.RetrieverStub(channel)
        try:
            info = (await stub.Describe(retriever_pb2.RetrieverDescribeRequest(), timeout=10)).retriever_info
        except grpc.aio.AioRpcError as exc:
            raise ConnectionError(f"cannot reach a Retriever at {address}: {exc.code().name} {exc.details()}") from None
        kind = retriever_pb2.RetrieverKind.Name(info.kind).removeprefix("RETRIEVER_KIND_").lower()
        workload = workload or kind
        meta = {"retriever": address, "retriever_kind": kind, "corpus": info.corpus}
        meta.update({k: v for k, v in (("top_k", top_k), ("deadline_ms", deadline_ms)) if v})
        recorded = failed = 0
        with TraceWriter(out, TraceHeader(generator="streamrag trace record", meta=meta)) as writer:
            for i, item in enumerate(queries, start=1):
                try:
                    query = await record_query(stub, item, workload=workload, top_k=top_k, deadline_ms=deadline_ms)
                except grpc.aio.AioRpcError as exc:
                    failed += 1
                    say(f"[{i}/{len(queries)}] {item.query_id}: FAILED {exc.code().name}: {exc.details()}")
                    continue
                except ValueError as exc:
                    failed += 1
                    say(f"[{i}/{len(queries)}] {item.query_id}: FAILED {exc}")
                    continue
                writer.write(query)
                recorded += 1
                say(_progress(i, len(queries), query))
    return RecordResult(recorded, failed)
