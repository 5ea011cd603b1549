"""The statistics the paper publishes, measured on any trace, and the published-beside-measured table.

`measure_query` reads one query's final context size and its invalidations; `trace_statistics`
sums a trace's measures and timing into the published figures' terms; `statistics_table`
prints them beside the published figures and the targets at the trace's scales.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from load_tests.synth.published import INVALIDATION_THRESHOLD, PUBLISHED, scaled_targets
from retriever_svc.replay.trace import TraceDocument, TraceQuery
from servicekit.stats import percentile


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True)
class QueryMeasure:
    tokens: int               # document tokens of the final context
    invalidated: int          # summed over updates, from the first changed document on (upper bound)
    updates: int              # updates that changed the list
    nontail_updates: int      # ... of which the first change is before the list's last document


def measure_query(query: TraceQuery, tokens: Callable[[TraceDocument], int]) -> QueryMeasure:
    """One query's final context tokens and what its updates invalidate."""
    context: list[TraceDocument] = []
    lost = updates = nontail = 0
    for chunk in query.chunks:
        if chunk.mode == "append":
            context = context + list(chunk.documents)
            continue
        new = list(chunk.documents)
        if context:
            j = next((i for i, (a, b) in enumerate(zip(context, new, strict=False)) if a.id != b.id),
                     min(len(context), len(new)))
            if j < len(context) or len(new) != len(context):
                updates += 1
                nontail += j < len(context) - 1
            lost += sum(tokens(d) for d in context[j:])
        context = new
    return QueryMeasure(sum(tokens(d) for d in context), lost, updates, nontail)


def measure_trace(queries: Sequence[TraceQuery], tokens: Callable[[TraceDocument], int]) -> list[QueryMeasure]:
    return [measure_query(q, tokens) for q in queries]


def trace_statistics(queries: Sequence[TraceQuery], measures: Sequence[QueryMeasure],
                     invalidation_threshold: float = INVALIDATION_THRESHOLD) -> dict[str, float]:
    """The statistics the paper publishes, from a trace's queries and their `measure_trace`.

    Tokens per query are the document texts' tokens in the final context. Tokens invalidated
    are per query, summed over updates: from the first document that differs from the
    previous list to its end (an upper bound: the engine loses only what it had computed).
    """
    per_query = [m.tokens for m in measures]
    invalidated = [m.invalidated for m in measures]
    chunk_counts = [len(q.chunks) for q in queries]
    firsts = [q.chunks[0].t_s for q in queries]
    totals = [q.chunks[-1].t_s for q in queries]
    gaps = [b.t_s - a.t_s for q in queries for a, b in zip(q.chunks, q.chunks[1:], strict=False)]
    updates = sum(m.updates for m in measures)
    return {
        "queries": len(queries),
        "tokens_mean": _mean(per_query), "tokens_p50": percentile(per_query, 50),
        "tokens_p95": percentile(per_query, 95), "tokens_max": max(per_query),
        "chunks_mean": _mean(chunk_counts), "chunks_p50": percentile(chunk_counts, 50),
        "chunks_min": min(chunk_counts), "chunks_max": max(chunk_counts),
        "chunks_share_6_10": _mean([6 <= n <= 10 for n in chunk_counts]),
        "chunks_share_le3": _mean([n <= 3 for n in chunk_counts]),
        "gap_median_ms": percentile(gaps, 50) * 1000, "gap_p1_ms": percentile(gaps, 1) * 1000,
        "gap_p99_ms": percentile(gaps, 99) * 1000, "gap_max_ms": max(gaps, default=math.nan) * 1000,
        "gap_share_1_1000ms": _mean([0.001 <= g <= 1.0 for g in gaps]),
        "first_chunk_mean_s": _mean(firsts), "retrieval_mean_s": _mean(totals),
        "retrieval_p95_s": percentile(totals, 95),
        "invalidated_mean": _mean(invalidated), "invalidated_p90": percentile(invalidated, 90),
        "invalidated_share_over": _mean([x > invalidation_threshold for x in invalidated]),
        "updates": updates,
        "updates_nontail_share": sum(m.nontail_updates for m in measures) / updates if updates else math.nan,
    }


def _num(value: float, digits: int = 0) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return f"{value:.{digits}f}" if digits else f"{round(value)}"


def statistics_table(workload: str, stats: dict[str, float], token_scale: float, time_scale: float,
                     capped: int = 0, label: str = "synthesized") -> str:
    """Rows of (metric, published, target at these scales, `label`: the trace's own) as aligned text."""
    pub = PUBLISHED[workload]
    target = scaled_targets(workload, token_scale, time_scale)
    tok = pub["tokens_per_query"]
    gap = pub["inter_chunk_arrival_ms"]
    rows = [
        ("queries", str(pub["queries"]), "-", _num(stats["queries"])),
        ("tokens/query mean", str(tok["mean"]), _num(target["tokens_mean"]), _num(stats["tokens_mean"])),
        ("tokens/query p50", str(tok["p50"]), _num(target["tokens_p50"]), _num(stats["tokens_p50"])),
        ("tokens/query p95", str(tok["p95"]), _num(target["tokens_p95"]), _num(stats["tokens_p95"])),
        ("tokens/query max", "-", "-", _num(stats["tokens_max"]) + (f" ({capped} capped)" if capped else "")),
    ]
    if workload == "crawler":
        rows.append(("chunks/query", "unimodal, around 6-10", "6-10",
                     f"{stats['chunks_share_6_10']:.0%} in 6-10, mean {stats['chunks_mean']:.1f}, "
                     f"{_num(stats['chunks_min'])}-{_num(stats['chunks_max'])}"))
    else:
        rows.append(("chunks/query", ">50% get <= 3", ">50% <= 3",
                     f"{stats['chunks_share_le3']:.0%} <= 3, mean {stats['chunks_mean']:.1f}, "
                     f"{_num(stats['chunks_min'])}-{_num(stats['chunks_max'])}"))
    rows += [
        ("inter-chunk gap median (ms)", str(gap["median"]), _num(target["gap_median_ms"], 1),
         _num(stats["gap_median_ms"], 1)),
        ("inter-chunk gap spread (ms)", gap["range_note"].split(",")[0], "-",
         f"p1 {_num(stats['gap_p1_ms'], 1)}, p99 {_num(stats['gap_p99_ms'], 0)}, max {_num(stats['gap_max_ms'], 0)}"
         + (f"; {stats['gap_share_1_1000ms']:.0%} in 1-1000" if workload == "anns" else "")),
        ("retrieval time mean (s)", str(pub["retrieval_latency_s"]["mean"]), _num(target["retrieval_mean_s"], 2),
         _num(stats["retrieval_mean_s"], 2)),
        ("first chunk mean (s)", "-", "-", _num(stats["first_chunk_mean_s"], 2)),
    ]
    if workload == "anns":
        threshold = target["invalidation_threshold_tokens"]
        rows += [
            (f"queries invalidating > {_num(threshold)} tokens", "> 10000: >10% (engine)", ">10%",
             f"{stats['invalidated_share_over']:.0%} (upper bound)"),
            ("tokens invalidated/query mean, p90", "-", "-",
             f"{_num(stats['invalidated_mean'])}, {_num(stats['invalidated_p90'])} (upper bound)"),
            ("updates changing a non-tail document", "-", "-",
             f"{stats['updates_nontail_share']:.0%} of {_num(stats['updates'])}"),
        ]
    header = ("metric", "published", f"target (x{token_scale:g} tokens, x{time_scale:g} time)", label)
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
             for r in [header, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
