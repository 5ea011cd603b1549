"""The Stream2LLM figures the synthesizer is calibrated to, typed once, and their scaled targets.

`PUBLISHED` copies the per-workload figures of CALIBRATION_SOURCE (Llama-3.1 tokens) that
the synthesizer uses; a test checks the copy against the shared file. Everything else (the
workload models, the targets, the comparison table, the trace header) reads them from here.
"""

from __future__ import annotations

from typing import Any

CALIBRATION_SOURCE = "shared/workloads/stream2llm_published_stats.json"
INVALIDATION_THRESHOLD = 10_000      # tokens, at paper scale (appendix A.1; the ANNS `tokens_invalidated` note)

PUBLISHED: dict[str, dict[str, Any]] = {
    "crawler": {
        "queries": 4322,
        "tokens_per_query": {"mean": 9100, "p50": 5800, "p95": 28900},
        "retrieval_latency_s": {"mean": 9.9},
        "inter_chunk_arrival_ms": {"median": 700.7,
                                   "range_note": "tens of ms to over 30 s, about three orders of magnitude"},
        "chunks_per_query": {"shape": "roughly unimodal, concentrated around 6-10"},
    },
    "anns": {
        "queries": 500,
        "tokens_per_query": {"mean": 13000, "p50": 10000, "p95": 31000},
        "retrieval_latency_s": {"mean": 4.5},
        "inter_chunk_arrival_ms": {"median": 36.7, "range_note": "bulk between 1 and 1000 ms"},
        "chunks_per_query": {"shape": "right-skewed, more than 50% of queries get at most 3 chunks"},
        "tokens_invalidated": {"note": "more than 10% of requests invalidate over 10,000 tokens at every load level"},
    },
}


def scaled_targets(workload: str, token_scale: float, time_scale: float) -> dict[str, float]:
    """The published figures at the requested scales (what the synthesized trace aims at)."""
    pub = PUBLISHED[workload]
    tokens = pub["tokens_per_query"]
    return {"tokens_mean": tokens["mean"] * token_scale, "tokens_p50": tokens["p50"] * token_scale,
            "tokens_p95": tokens["p95"] * token_scale,
            "gap_median_ms": pub["inter_chunk_arrival_ms"]["median"] * time_scale,
            "retrieval_mean_s": pub["retrieval_latency_s"]["mean"] * time_scale,
            "invalidation_threshold_tokens": INVALIDATION_THRESHOLD * token_scale}
