"""Token traces: a retrieval trace (docs/trace-format.md) reduced to what a replay's speed depends on, each
chunk's documents as (id, token count), with its times and modes. `streamrag bench gpu-replay` replays them
with random token ids; `--make-traces` writes them from `streamrag trace synth`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servicekit.stats import percentile

TRACE_FORMAT = "streamrag-token-trace"


@dataclass(frozen=True)
class TokenChunk:
    t_s: float                                 # seconds from the query's arrival
    mode: str                                  # "append" | "update"
    docs: tuple[tuple[str, int], ...]          # (document id, tokens)


@dataclass(frozen=True)
class TokenQuery:
    query_id: str
    chunks: tuple[TokenChunk, ...]

    @property
    def duration_s(self) -> float:
        return self.chunks[-1].t_s

    def final_docs(self) -> list[tuple[str, int]]:
        docs: list[tuple[str, int]] = []
        for chunk in self.chunks:
            docs = list(chunk.docs) if chunk.mode == "update" else docs + list(chunk.docs)
        return docs

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.final_docs())

    @property
    def peak_tokens(self) -> int:
        """The most document tokens any stage holds (an ANNS list may shrink)."""
        docs: list[tuple[str, int]] = []
        peak = 0
        for chunk in self.chunks:
            docs = list(chunk.docs) if chunk.mode == "update" else docs + list(chunk.docs)
            peak = max(peak, sum(n for _, n in docs))
        return peak

    def scaled(self, tokens: float, times: float) -> TokenQuery:
        return TokenQuery(self.query_id, tuple(
            TokenChunk(round(c.t_s * times, 6), c.mode, tuple((d, max(1, round(n * tokens))) for d, n in c.docs))
            for c in self.chunks))


@dataclass(frozen=True)
class TokenTrace:
    workload: str
    queries: tuple[TokenQuery, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def statistics(self) -> dict[str, Any]:
        tokens = sorted(q.tokens for q in self.queries)
        durations = [q.duration_s for q in self.queries]
        return {"queries": len(self.queries), "tokens_mean": round(sum(tokens) / len(tokens)),
                "tokens_p50": round(percentile(tokens, 50)), "tokens_p95": round(percentile(tokens, 95)),
                "tokens_max": tokens[-1], "tokens_total": sum(tokens),
                "chunks_mean": round(sum(len(q.chunks) for q in self.queries) / len(self.queries), 2),
                "retrieval_mean_s": round(sum(durations) / len(durations), 3),
                "retrieval_max_s": round(max(durations), 3)}


def write_token_trace(path: Path, trace: TokenTrace) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"format": TRACE_FORMAT, "version": 1, "workload": trace.workload, "meta": trace.meta})]
    lines += [json.dumps({"query_id": q.query_id,
                          "chunks": [{"t_s": c.t_s, "mode": c.mode, "docs": [list(d) for d in c.docs]}
                                     for c in q.chunks]}, separators=(",", ":"))
              for q in trace.queries]
    path.write_text("\n".join(lines) + "\n")


def read_token_trace(path: Path) -> TokenTrace:
    """A compact token trace; a malformed one is a ValueError naming the file and line."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path}: empty token trace")
    try:
        header = json.loads(lines[0])
        if header.get("format") != TRACE_FORMAT or header.get("version") != 1:
            raise ValueError(f"not a {TRACE_FORMAT} version 1 header")
        queries = []
        for n, line in enumerate(lines[1:], start=2):
            try:
                queries.append(_query(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"line {n}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not queries:
        raise ValueError(f"{path}: no queries")
    return TokenTrace(str(header["workload"]), tuple(queries), dict(header.get("meta", {})))


def _query(obj: dict) -> TokenQuery:
    chunks, previous = [], 0.0
    for i, c in enumerate(obj["chunks"]):
        t_s, mode = float(c["t_s"]), c["mode"]
        if not (math.isfinite(t_s) and t_s >= previous):
            raise ValueError(f"chunks[{i}].t_s {t_s} must be finite and not earlier than the chunk before")
        if mode not in ("append", "update"):
            raise ValueError(f"chunks[{i}].mode must be append or update, got {mode!r}")
        docs = tuple((str(d), int(n)) for d, n in c["docs"])
        if any(n < 1 for _, n in docs):
            raise ValueError(f"chunks[{i}]: a document has fewer than 1 token")
        chunks.append(TokenChunk(t_s, mode, docs))
        previous = t_s
    if not chunks:
        raise ValueError("a query has no chunks")
    return TokenQuery(str(obj["query_id"]), tuple(chunks))


def token_trace_of(queries: Sequence[Any], count: Callable[[str], int], workload: str,
                   meta: dict[str, Any]) -> TokenTrace:
    """A `streamrag-trace`'s queries as token counts, updates in the orchestrator's stable order (what
    both replay paths send: replay_run.stable_query)."""
    from load_tests.replay_run import stable_query

    tokens: dict[str, int] = {}

    def n(doc: Any) -> int:
        if doc.id not in tokens:
            tokens[doc.id] = max(1, count(doc.text))
        return tokens[doc.id]

    out = []
    for q in map(stable_query, queries):
        out.append(TokenQuery(q.query_id, tuple(TokenChunk(c.t_s, c.mode, tuple((d.id, n(d)) for d in c.documents))
                                                for c in q.chunks)))
    return TokenTrace(workload, tuple(out), meta)
