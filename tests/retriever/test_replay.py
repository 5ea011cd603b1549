"""The replay retriever behind a real grpc.aio Retriever server on loopback, and `trace record`.

Server and client share the test's event loop (a sync client inside an async test would
block the loop the server runs on). Timing is asserted loosely: order, and a lower bound.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import grpc
import pytest

from protos import retriever_pb2, retriever_pb2_grpc
from retriever_svc.replay.backend import ReplayBackend, build_backend, chunk_to_proto, load_backend, stable_index
from retriever_svc.replay.record import add_trace_record_args, load_queries, record_trace, run_trace_record
from retriever_svc.replay.trace import Trace, TraceChunk, TraceDocument, TraceQuery, TraceStage, read_trace, write_trace
from retriever_svc.service import InvalidQuery, RetrievalQuery
from tests.support.retrievers import serving_retriever


def doc(i: int) -> TraceDocument:
    return TraceDocument(f"d{i}", f"Title {i}", f"http://127.0.0.1/{i}.html", f"text of document {i}", 1.0 / (i + 1))


ANNS = TraceQuery("anns-1", "What is a generator?", "anns", "recorded", (
    TraceChunk(0.0, "update", False, (doc(1), doc(2)), TraceStage(0, 16, 0.5)),
    TraceChunk(0.5, "update", False, (doc(2), doc(3)), TraceStage(1, 64)),
    TraceChunk(1.0, "update", True, (doc(3), doc(4)), TraceStage(2, 256, 1.0)),
))
CRAWL = TraceQuery("crawl-1", "How do I open a file?", "crawler", "synthesized", (
    TraceChunk(0.2, "append", False, (doc(5),)),
    TraceChunk(0.9, "append", False, (doc(6), doc(7))),
    TraceChunk(1.5, "append", True),
))
SLOW = TraceQuery("slow-1", "a query that takes a while", "crawler", "synthesized", (
    TraceChunk(0.0, "append", False, (doc(8),)),
    TraceChunk(30.0, "append", True, (doc(9),)),
))
TRACE = Trace((ANNS, CRAWL, SLOW))


def query(text: str, **options: str) -> RetrievalQuery:
    return RetrievalQuery(text, 10, 30.0, options)


async def retrieve(address: str, text: str, **options: str) -> list[tuple[float, retriever_pb2.ContextChunk]]:
    """(seconds since the call, chunk) for every chunk of one Retrieve call."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = retriever_pb2_grpc.RetrieverStub(channel)
        started = time.monotonic()
        return [(time.monotonic() - started, r.chunk)
                async for r in stub.Retrieve(retriever_pb2.RetrieveRequest(query=text, options=options))]


def without_timing(chunk: retriever_pb2.ContextChunk) -> retriever_pb2.ContextChunk:
    out = retriever_pb2.ContextChunk()
    out.CopyFrom(chunk)
    out.ClearField("seq")
    out.ClearField("emitted_unix_ms")
    return out


def expected_chunks(q: TraceQuery) -> list:
    """What the replay retriever streams for `q`: each chunk, an update with its stability hints."""
    out, previous = [], None
    for chunk in q.chunks:
        out.append(chunk_to_proto(chunk, previous))
        if chunk.mode == "update":
            previous = [d.id for d in chunk.documents]
    return out


def contents(q: TraceQuery) -> list[tuple]:
    """A query's chunks without their times."""
    return [(c.mode, c.final, c.stage, c.documents) for c in q.chunks]


async def test_replay_streams_the_trace_chunks_in_order() -> None:
    async with serving_retriever(ReplayBackend(TRACE, time_scale=0), "replay") as served:
        address = served.address
        got = [chunk for _, chunk in await retrieve(address, "anything", query_id="anns-1")]
    assert [c.seq for c in got] == [0, 1, 2]
    assert [c.final for c in got] == [False, False, True]
    assert all(c.mode == retriever_pb2.CHUNK_MODE_UPDATE for c in got)
    assert [without_timing(c) for c in got] == expected_chunks(ANNS)
    # stability hints on the refinements (retriever_svc.stability), none on the final stage
    assert all(d.HasField("stability") for c in got[:-1] for d in c.documents)
    assert not any(d.HasField("stability") for d in got[-1].documents)
    first = got[0].documents[0]
    assert (first.id, first.title, first.url, first.text, first.score, first.source) == (
        "d1", "Title 1", "http://127.0.0.1/1.html", "text of document 1", 0.5, "replay")
    assert got[0].stage.search_list_size == 16 and got[0].stage.recall_at_k == 0.5
    assert not got[1].stage.HasField("recall_at_k")
    assert all(c.emitted_unix_ms > 0 for c in got)


async def test_replay_keeps_the_gaps_scaled_by_time_scale() -> None:
    scale = 0.1                                            # CRAWL lasts 1.5 s; scaled: 0.15 s
    async with serving_retriever(ReplayBackend(TRACE, time_scale=scale), "replay") as served:
        address = served.address
        got = await retrieve(address, CRAWL.query)
    arrivals = [t for t, _ in got]
    assert [c.mode for _, c in got] == [retriever_pb2.CHUNK_MODE_APPEND] * 3
    assert [len(c.documents) for _, c in got] == [1, 2, 0]
    assert arrivals == sorted(arrivals)
    assert arrivals[-1] >= CRAWL.duration_s * scale - 0.05      # lenient lower bound
    assert arrivals[1] - arrivals[0] >= (0.9 - 0.2) * scale - 0.05
    assert arrivals[-1] < CRAWL.duration_s                      # not replayed at real time


def test_query_is_chosen_by_id_then_text_then_a_stable_hash() -> None:
    backend = ReplayBackend(TRACE)
    assert backend.select(query("How do I open a file?", query_id="anns-1")) is ANNS
    assert backend.select(query("  how do I   OPEN a file? ")) is CRAWL
    unseen = [f"unseen question {i}" for i in range(30)]
    picks = [backend.select(query(q)) for q in unseen]
    assert picks == [ReplayBackend(TRACE).select(query(q)) for q in unseen]      # deterministic
    assert picks == [TRACE.queries[stable_index(q, 3)] for q in unseen]
    assert len({p.query_id for p in picks}) > 1                                  # spread over the trace
    assert stable_index("hello", 1000) == 342                  # same in every process (no hash seed)
    with pytest.raises(InvalidQuery, match="unknown query_id 'nope'"):
        backend.select(query("x", query_id="nope"))


async def test_query_selection_over_grpc_and_an_unknown_option() -> None:
    async with serving_retriever(ReplayBackend(TRACE, time_scale=0), "replay") as served:
        address = served.address
        by_text = await retrieve(address, ANNS.query)
        assert [without_timing(c) for _, c in by_text] == expected_chunks(ANNS)
        by_id = await retrieve(address, ANNS.query, query_id="crawl-1")
        assert [without_timing(c) for _, c in by_id] == expected_chunks(CRAWL)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await retrieve(address, "question", depth="2")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "query_id" in caught.value.details()             # names what replay understands


# Remove this marker once retriever_svc/service.py turns an InvalidQuery raised by a backend's
# stream into INVALID_ARGUMENT (today only its own validate() is mapped; the rest is UNKNOWN).
async def test_an_unknown_query_id_is_invalid_argument() -> None:
    async with serving_retriever(ReplayBackend(TRACE, time_scale=0), "replay") as served:
        address = served.address
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await retrieve(address, "question", query_id="nope")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown query_id 'nope'" in caught.value.details()


async def test_cancelling_the_call_stops_the_replay_promptly() -> None:
    closed = asyncio.Event()

    class Probe(ReplayBackend):
        async def retrieve(self, q):
            try:
                async for chunk in super().retrieve(q):
                    yield chunk
            finally:
                closed.set()

    async with serving_retriever(Probe(TRACE, time_scale=1.0), "replay") as served:
        call = served.retriever.Retrieve(
            retriever_pb2.RetrieveRequest(query="x", options={"query_id": "slow-1"}))
        first = await call.read()
        assert first.chunk.documents[0].id == "d8"
        call.cancel()
        await asyncio.wait_for(closed.wait(), timeout=5)       # not the 30 s the trace waits


def test_describe_names_the_trace_and_its_mix(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "mix.jsonl", TRACE.queries)
    info = load_backend(path, time_scale=0.25).describe()
    assert info.kind == retriever_pb2.RETRIEVER_KIND_REPLAY
    assert info.corpus == "mix.jsonl"
    assert info.num_documents == 9
    assert info.facts["queries"] == "3"
    assert info.facts["workload_mix"] == "anns:1,crawler:2"
    assert info.facts["source_mix"] == "recorded:1,synthesized:2"
    assert info.facts["time_scale"] == "0.25"


def test_build_backend_reports_bad_flags_and_files(tmp_path: Path) -> None:
    def args(trace, time_scale=1.0):
        return argparse.Namespace(trace=trace, time_scale=time_scale)

    with pytest.raises(SystemExit, match="needs --trace"):
        build_backend(args(None))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query_id": "q"}\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl:1: .*query is missing"):
        build_backend(args(bad))
    good = write_trace(tmp_path / "good.jsonl", TRACE.queries)
    with pytest.raises(SystemExit, match="time-scale"):
        build_backend(args(good, -1.0))
    assert build_backend(args(str(good), 0.5)).time_scale == 0.5


async def test_record_replay_record_round_trip(tmp_path: Path) -> None:
    source = write_trace(tmp_path / "source.jsonl", [ANNS, CRAWL])
    lines: list[str] = []
    async with serving_retriever(load_backend(source, time_scale=0.02), "replay") as served:
        address = served.address
        result = await record_trace(address, load_queries([str(source)]), tmp_path / "first.jsonl",
                                    workload="replayed", say=lines.append)
    assert (result.recorded, result.failed) == (2, 0)
    assert [line.split(":")[0] for line in lines] == ["[1/2] anns-1", "[2/2] crawl-1"]
    first = read_trace(tmp_path / "first.jsonl")
    assert first.header.generator == "streamrag trace record"
    assert first.header.meta["retriever_kind"] == "replay"
    for recorded, original in zip(first.queries, [ANNS, CRAWL], strict=True):
        assert (recorded.query_id, recorded.query, recorded.workload, recorded.source) == (
            original.query_id, original.query, "replayed", "recorded")
        assert contents(recorded) == contents(original)
        times = [c.t_s for c in recorded.chunks]
        assert times == sorted(times) and times[-1] >= original.duration_s * 0.02 - 0.05

    async with serving_retriever(load_backend(tmp_path / "first.jsonl", time_scale=0), "replay") as served:
        address = served.address
        await record_trace(address, load_queries([str(source)]), tmp_path / "second.jsonl", say=lines.append)
    second = read_trace(tmp_path / "second.jsonl")
    assert [contents(q) for q in second.queries] == [contents(q) for q in first.queries]
    assert {q.workload for q in second.queries} == {"replay"}          # default: the retriever's kind


async def test_trace_record_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_trace_record_args(parser)
    questions = tmp_path / "questions.txt"
    questions.write_text("# one per line\nWhat is a generator?\n\n")
    out = tmp_path / "out" / "rec.jsonl"
    async with serving_retriever(ReplayBackend(TRACE, time_scale=0), "replay") as served:
        address = served.address
        args = parser.parse_args(["--retriever", address, "--queries", str(questions), "How do I open a file?",
                                  "--out", str(out), "--top-k", "5", "--workload", "anns"])
        # The command runs its own event loop: give it a thread so this loop keeps serving.
        assert await asyncio.to_thread(run_trace_record, args) == 0
    recorded = read_trace(out)
    assert [(q.query_id, q.query) for q in recorded.queries] == [("q0001", ANNS.query), ("q0002", CRAWL.query)]
    assert [contents(q) for q in recorded.queries] == [contents(ANNS), contents(CRAWL)]
    assert recorded.header.meta["top_k"] == 5
    err = capsys.readouterr().err
    assert "[1/2] q0001: 3 chunks (0 append, 3 update), 6 documents" in err
    assert f"wrote 2 queries to {out}" in err


def test_trace_record_command_without_a_retriever_fails_cleanly(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_trace_record_args(parser)
    args = parser.parse_args(["--retriever", "127.0.0.1:1", "--queries", "q", "--out", str(tmp_path / "x.jsonl")])
    assert run_trace_record(args) == 1
    assert "cannot reach a Retriever at 127.0.0.1:1" in capsys.readouterr().err


def test_load_queries_numbers_around_given_ids(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", [ANNS])
    items = load_queries(["first", str(path), "third"])
    assert [(i.query_id, i.query) for i in items] == [("q0001", "first"), ("anns-1", ANNS.query), ("q0002", "third")]
    bad = tmp_path / "bad.txt"
    bad.write_text('ok\n{"id": 3}\n')
    with pytest.raises(ValueError, match=r"bad.txt:2: .*\"query\""):
        load_queries([str(bad)])
