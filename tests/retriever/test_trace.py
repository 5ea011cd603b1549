"""The trace format (retriever_svc/replay/trace.py): round trips, and line-numbered validation errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retriever_svc.replay.trace import (
    FORMAT_NAME,
    Trace,
    TraceChunk,
    TraceDocument,
    TraceFormatError,
    TraceHeader,
    TraceQuery,
    TraceStage,
    TraceWriter,
    parse_trace,
    read_trace,
    write_trace,
)


def sample_queries() -> list[TraceQuery]:
    doc = TraceDocument("py/glossary#generator", "Glossary — generator", "http://127.0.0.1:8765/glossary.html",
                        "A function which returns a generator iterator. «ünïcode»", 0.8125)
    anns = TraceQuery("anns-1", "What is a generator?", "anns", "recorded", (
        TraceChunk(0.012, "update", False, (doc,), TraceStage(0, 16, 0.5)),
        TraceChunk(0.047, "update", False, (doc, TraceDocument("py/iter", score=0.5)), TraceStage(1, 64)),
        TraceChunk(0.047, "update", True, (doc,), TraceStage(2, 256, 1.0)),
    ), meta={"top_k": 2})
    crawl = TraceQuery("crawl-1", "How do I open a file?", "crawler", "synthesized", (
        TraceChunk(0.7, "append", False, (TraceDocument("page-1", "Files", "http://x/files", "open()", 3.5),)),
        TraceChunk(9.9, "append", True),
    ))
    return [anns, crawl]


def record_line(**changes) -> str:
    """One valid record line as JSON, with top-level fields replaced by `changes`."""
    obj = {"query_id": "q1", "query": "a question", "workload": "anns", "source": "synthesized",
           "chunks": [{"t_s": 0.1, "mode": "update", "final": False, "documents": [{"id": "d1"}]},
                      {"t_s": 0.3, "mode": "update", "final": True, "documents": [{"id": "d2", "score": 1}]}]}
    obj.update(changes)
    return json.dumps(obj)


def chunks(*specs: tuple) -> list[dict]:
    return [{"t_s": t, "mode": mode, "final": final} for t, mode, final in specs]


def test_write_then_read_gives_the_same_trace(tmp_path: Path) -> None:
    header = TraceHeader(created="2025-01-02T03:04:05Z", time_scale=0.5, generator="test", meta={"corpus": "x"})
    path = write_trace(tmp_path / "t.jsonl", sample_queries(), header)
    assert read_trace(path) == Trace(tuple(sample_queries()), header)
    assert json.loads(path.read_text().splitlines()[0])["format"] == FORMAT_NAME


def test_header_is_optional_blank_lines_are_skipped_and_defaults_fill_in() -> None:
    trace = parse_trace(["", record_line(), "   "])
    assert trace.header is None
    doc = trace.queries[0].chunks[0].documents[0]
    assert doc == TraceDocument("d1", "", "", "", 0.0)
    assert trace.queries[0].chunks[1].documents[0].score == 1.0


def test_writer_refuses_invalid_and_repeated_queries(tmp_path: Path) -> None:
    good = sample_queries()[0]
    not_final = TraceQuery("x", "q", "anns", "recorded", (TraceChunk(0.0, "append", False),))
    with TraceWriter(tmp_path / "t.jsonl") as writer:
        writer.write(good)
        with pytest.raises(ValueError, match="final"):
            writer.write(not_final)
        with pytest.raises(ValueError, match="already written"):
            writer.write(good)
    assert len(read_trace(tmp_path / "t.jsonl").queries) == 1


@pytest.mark.parametrize(("lines", "line", "message"), [
    ([record_line(), "{not json"], 2, "not valid JSON"),
    ([record_line(chunks=chunks((0.5, "append", False), (0.2, "append", True)))], 1,
     "chunks[1].t_s 0.2 is earlier than the chunk before (0.5)"),
    ([record_line(chunks=chunks((0.1, "append", True), (0.2, "append", True)))], 1,
     "chunks[0] is final but 1 more chunk(s) follow"),
    ([record_line(chunks=chunks((0.1, "append", False)))], 1, "the last chunk (chunks[0]) must have final: true"),
    ([record_line(chunks=chunks((0.1, "replace", True)))], 1, "chunks[0].mode must be one of"),
    ([record_line(chunks=chunks((-1, "append", True)))], 1, "chunks[0].t_s must be a finite number >= 0"),
    ([record_line(chunks=[{"t_s": 0, "mode": "append", "final": "yes"}])], 1, "chunks[0].final must be true or false"),
    ([record_line(chunks=[{"tt_s": 0, "mode": "append", "final": True}])], 1, "chunks[0]: unknown field(s) ['tt_s']"),
    ([record_line(chunks=[{"t_s": 0, "mode": "append", "final": True, "documents": [{"title": "x"}]}])], 1,
     "chunks[0].documents[0].id is missing"),
    ([record_line(chunks=[])], 1, "chunks must not be empty"),
    ([record_line(query_id=None)], 1, "query_id must be a string"),
    ([record_line(source="guessed")], 1, "source must be one of ['recorded', 'synthesized']"),
    ([record_line(), record_line(query="other")], 2, "query_id 'q1' repeats line 1"),
    ([record_line(), json.dumps({"format": FORMAT_NAME, "version": 1})], 2, "header line may only be the first"),
    ([json.dumps({"format": FORMAT_NAME, "version": 2}), record_line()], 1, "version 2 is not supported"),
    (["[1, 2]"], 1, "must be a JSON object"),
])
def test_validation_errors_name_the_line_and_the_field(lines: list[str], line: int, message: str) -> None:
    with pytest.raises(TraceFormatError) as caught:
        parse_trace(lines, source="t.jsonl")
    assert caught.value.line == line
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"t.jsonl:{line}: ")


def test_a_trace_without_queries_or_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no queries"):
        parse_trace([json.dumps({"format": FORMAT_NAME, "version": 1})])
    with pytest.raises(TraceFormatError, match="cannot read"):
        read_trace(tmp_path / "absent.jsonl")
