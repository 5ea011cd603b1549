"""The retrieval trace format: what a retriever streamed for each query, and when.

A trace is a JSON-lines file (described for users in docs/trace-format.md): an optional
header line, then one query per line with its chunks, each stamped with `t_s`, the seconds
since the query's call started. The replay retriever streams it back, `streamrag trace
record` writes it from a live retriever, and the load-test synthesizer and replay benchmark
read and write it through this module.

This module owns the dataclasses, reading and writing, and validation. Reading never
returns an invalid trace: every problem is a `TraceFormatError` naming the file, the line
and the field (`trace.jsonl:7: chunks[2].t_s 0.5 is earlier than the chunk before (0.8)`).
Writing validates too, so a file written here always reads back. Standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, ClassVar

FORMAT_NAME = "streamrag-trace"
FORMAT_VERSION = 1
MODES = ("append", "update")
SOURCES = ("recorded", "synthesized")


class TraceFormatError(ValueError):
    """A trace that does not follow the format; the message starts with `file:line:`."""

    def __init__(self, message: str, *, source: str = "<trace>", line: int | None = None) -> None:
        self.source, self.line, self.reason = source, line, message
        super().__init__(f"{source}:{line}: {message}" if line else f"{source}: {message}")


@dataclass(frozen=True)
class TraceDocument:
    id: str
    title: str = ""
    url: str = ""
    text: str = ""
    score: float = 0.0


@dataclass(frozen=True)
class TraceStage:
    """The search stage that produced a chunk (ANNS early results); mirrors `StageInfo`."""

    index: int
    search_list_size: int = 0
    recall_at_k: float | None = None


@dataclass(frozen=True)
class TraceChunk:
    t_s: float                                  # seconds since the query's call started
    mode: str                                   # "append" | "update"
    final: bool
    documents: tuple[TraceDocument, ...] = ()
    stage: TraceStage | None = None


@dataclass(frozen=True)
class TraceQuery:
    query_id: str
    query: str
    workload: str                               # "crawler", "anns", ... (free, non-empty)
    source: str                                 # "recorded" | "synthesized"
    chunks: tuple[TraceChunk, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.chunks[-1].t_s


@dataclass(frozen=True)
class TraceHeader:
    version: int = FORMAT_VERSION
    created: str = ""                           # ISO 8601, UTC
    time_scale: float = 1.0                     # the t_s values are already this times real time
    generator: str = ""                         # what wrote the file
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Trace:
    queries: tuple[TraceQuery, ...]
    header: TraceHeader | None = None


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# --- validation -------------------------------------------------------------------------------

def check_query(query: TraceQuery) -> None:
    """Raise ValueError unless `query` keeps the format's invariants."""
    for name in ("query_id", "query", "workload"):
        if not getattr(query, name).strip():
            raise ValueError(f"{name} must not be empty")
    if query.source not in SOURCES:
        raise ValueError(f"source must be one of {list(SOURCES)}, got {query.source!r}")
    if not query.chunks:
        raise ValueError("chunks must not be empty: a query has at least its final chunk")
    previous = 0.0
    last = len(query.chunks) - 1
    for i, chunk in enumerate(query.chunks):
        if not (math.isfinite(chunk.t_s) and chunk.t_s >= 0):
            raise ValueError(f"chunks[{i}].t_s must be a finite number >= 0, got {chunk.t_s}")
        if chunk.t_s < previous:
            raise ValueError(f"chunks[{i}].t_s {chunk.t_s} is earlier than the chunk before ({previous}); "
                             "t_s must not decrease")
        previous = chunk.t_s
        if chunk.mode not in MODES:
            raise ValueError(f"chunks[{i}].mode must be one of {list(MODES)}, got {chunk.mode!r}")
        if chunk.final and i != last:
            raise ValueError(f"chunks[{i}] is final but {last - i} more chunk(s) follow; only the last chunk is final")
        for j, doc in enumerate(chunk.documents):
            if not doc.id:
                raise ValueError(f"chunks[{i}].documents[{j}].id must not be empty")
    if not query.chunks[-1].final:
        raise ValueError(f"the last chunk (chunks[{last}]) must have final: true")


class _Reader:
    """Typed access to one JSON object's fields; errors name the field's path."""

    _MISSING = object()
    _KINDS: ClassVar[dict[type, str]] = {str: "a string", bool: "true or false", float: "a number", int: "an integer",
                                         dict: "an object", list: "a list"}

    def __init__(self, obj: Any, where: str, allowed: Iterable[str]) -> None:
        if not isinstance(obj, dict):
            raise ValueError(f"{where or 'line'} must be a JSON object, got {type(obj).__name__}")
        extra = sorted(set(obj) - set(allowed))
        if extra:
            raise ValueError(f"{where + ': ' if where else ''}unknown field(s) {extra}; "
                             f"allowed: {sorted(allowed)} (put extras in \"meta\")")
        self.obj, self.where = obj, where

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        path = f"{self.where}.{key}" if self.where else key
        if key not in self.obj or (self.obj[key] is None and default is not self._MISSING):
            if default is self._MISSING:
                raise ValueError(f"{path} is missing")
            return default
        value = self.obj[key]
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
              else isinstance(value, int) and not isinstance(value, bool) if kind is int
              else isinstance(value, kind))
        if not ok:
            raise ValueError(f"{path} must be {self._KINDS[kind]}, got {json.dumps(value)[:40]}")
        return float(value) if kind is float else value


def _document_from_json(obj: Any, where: str) -> TraceDocument:
    r = _Reader(obj, where, ("id", "title", "url", "text", "score"))
    return TraceDocument(r.get("id", str), r.get("title", str, ""), r.get("url", str, ""), r.get("text", str, ""),
                         r.get("score", float, 0.0))


def _chunk_from_json(obj: Any, where: str) -> TraceChunk:
    r = _Reader(obj, where, ("t_s", "mode", "final", "documents", "stage"))
    stage = None
    if r.get("stage", dict, None) is not None:
        s = _Reader(obj["stage"], f"{where}.stage", ("index", "search_list_size", "recall_at_k"))
        stage = TraceStage(s.get("index", int), s.get("search_list_size", int, 0), s.get("recall_at_k", float, None))
    documents = tuple(_document_from_json(d, f"{where}.documents[{j}]")
                      for j, d in enumerate(r.get("documents", list, [])))
    return TraceChunk(r.get("t_s", float), r.get("mode", str), r.get("final", bool, False), documents, stage)


def query_from_json(obj: Any) -> TraceQuery:
    """One record line's object as a `TraceQuery`; ValueError (with the field) if it is not valid."""
    r = _Reader(obj, "", ("query_id", "query", "workload", "source", "chunks", "meta"))
    query_id, text, workload, source = (r.get(name, str) for name in ("query_id", "query", "workload", "source"))
    chunks = tuple(_chunk_from_json(c, f"chunks[{i}]") for i, c in enumerate(r.get("chunks", list)))
    query = TraceQuery(query_id, text, workload, source, chunks, r.get("meta", dict, {}))
    check_query(query)
    return query


def header_from_json(obj: Any) -> TraceHeader:
    r = _Reader(obj, "header", ("format", "version", "created", "time_scale", "generator", "meta"))
    if r.get("format", str) != FORMAT_NAME:
        raise ValueError(f"header.format must be {FORMAT_NAME!r}, got {obj['format']!r}")
    version = r.get("version", int)
    if version != FORMAT_VERSION:
        raise ValueError(f"trace format version {version} is not supported (this reader knows {FORMAT_VERSION})")
    time_scale = r.get("time_scale", float, 1.0)
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"header.time_scale must be a number > 0, got {time_scale}")
    return TraceHeader(version, r.get("created", str, ""), time_scale, r.get("generator", str, ""),
                       r.get("meta", dict, {}))


# --- reading ----------------------------------------------------------------------------------

def parse_trace(lines: Iterable[str], source: str = "<trace>") -> Trace:
    """Parse JSON lines (blank lines skipped); raise TraceFormatError at the first problem."""
    header: TraceHeader | None = None
    queries: list[TraceQuery] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"not valid JSON: {exc.msg} (column {exc.colno})", source=source,
                                   line=number) from None
        try:
            if isinstance(obj, dict) and "format" in obj:
                if header is not None or queries:
                    raise ValueError("a header line may only be the first line")
                header = header_from_json(obj)
                continue
            query = query_from_json(obj)
        except ValueError as exc:
            raise TraceFormatError(str(exc), source=source, line=number) from None
        if query.query_id in seen:
            raise TraceFormatError(f"query_id {query.query_id!r} repeats line {seen[query.query_id]}",
                                   source=source, line=number)
        seen[query.query_id] = number
        queries.append(query)
    if not queries:
        raise TraceFormatError("the trace has no queries", source=source)
    return Trace(tuple(queries), header)


def read_trace(path: str | Path) -> Trace:
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as f:
            return parse_trace(f, source=str(path))
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None


# --- writing ----------------------------------------------------------------------------------

def _chunk_to_json(chunk: TraceChunk) -> dict[str, Any]:
    out: dict[str, Any] = {"t_s": chunk.t_s, "mode": chunk.mode, "final": chunk.final,
                           "documents": [asdict(d) for d in chunk.documents]}
    if chunk.stage is not None:
        stage = {"index": chunk.stage.index, "search_list_size": chunk.stage.search_list_size}
        if chunk.stage.recall_at_k is not None:
            stage["recall_at_k"] = chunk.stage.recall_at_k
        out["stage"] = stage
    return out


def query_to_json(query: TraceQuery) -> dict[str, Any]:
    check_query(query)
    out: dict[str, Any] = {"query_id": query.query_id, "query": query.query, "workload": query.workload,
                           "source": query.source, "chunks": [_chunk_to_json(c) for c in query.chunks]}
    if query.meta:
        out["meta"] = dict(query.meta)
    return out


def header_to_json(header: TraceHeader) -> dict[str, Any]:
    out: dict[str, Any] = {"format": FORMAT_NAME, "version": header.version, "created": header.created or now_iso(),
                           "time_scale": header.time_scale, "generator": header.generator}
    if header.meta:
        out["meta"] = dict(header.meta)
    return out


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


class TraceWriter:
    """Writes a trace one query at a time (flushed per query, so a long recording keeps its progress)."""

    def __init__(self, path: str | Path, header: TraceHeader | None = None) -> None:
        self.path = Path(path)
        self._file: IO[str] = self.path.open("w", encoding="utf-8")
        self._ids: set[str] = set()
        if header is not None:
            self._file.write(_line(header_to_json(header)))

    def write(self, query: TraceQuery) -> None:
        if query.query_id in self._ids:
            raise ValueError(f"query_id {query.query_id!r} was already written")
        self._file.write(_line(query_to_json(query)))
        self._file.flush()
        self._ids.add(query.query_id)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trace(path: str | Path, queries: Sequence[TraceQuery], header: TraceHeader | None = None) -> Path:
    with TraceWriter(path, header) as writer:
        for query in queries:
            writer.write(query)
    return writer.path
