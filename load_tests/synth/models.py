"""The workload models: how each workload's tokens, chunk counts and timing are drawn.

Per workload (every draw is seeded and stratified, see `fitting`):

- tokens per query: a lognormal with separate spreads below and above the median, fitted
  exactly to the published mean, p50 and p95;
- chunks per query: crawler a rounded lognormal around 8 (unimodal, mostly 6 to 10);
  ANNS 1 + a geometric count (right-skewed, more than half the queries get at most 3);
- timing: time to the first chunk, then inter-chunk gaps, both lognormal. The gaps' median
  is the published one; the first-chunk times are scaled so the mean total retrieval time
  (the final chunk's `t_s`) is the published mean;
- crawler: each chunk appends one new page (a run of consecutive passages of our corpus,
  cut to its token share), so the context grows chunk by chunk;
- ANNS: each chunk is an `update` with the complete top-k list. The final list is the true
  top-k; earlier lists lack some of its documents (held by lower-scored impostors) or rank
  two of them the wrong way round, and each update inserts a found document at its rank or
  fixes an order, at any position, front included. Everything from that position on is
  invalidated (hence more than 10,000 tokens for some queries at paper scale).

A model holds only its own shape choices; its targets are read from `PUBLISHED`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from load_tests.synth.fitting import fit_split_lognormal, lognormal_quantile
from load_tests.synth.published import PUBLISHED


def _crawler_chunks(u: float) -> int:
    return min(20, max(2, round(lognormal_quantile(u, math.log(8.0), 0.3))))


_ANNS_GEOMETRIC_P = 0.234            # P(n <= 3) = 1 - (1 - p)^3 = 0.55


def _anns_chunks(u: float) -> int:
    return min(16, 1 + math.floor(math.log(1 - u) / math.log(1 - _ANNS_GEOMETRIC_P)))


@dataclass(frozen=True)
class WorkloadModel:
    name: str                        # a key of PUBLISHED
    mode: str                        # "append" | "update"
    gap_sigma: float
    first_sigma: float
    chunks: Callable[[float], int]   # quantile function: u in (0, 1) -> chunks per query
    chunks_note: str

    @property
    def tokens(self) -> tuple[float, float, float]:
        """The published mean, p50 and p95 of tokens per query."""
        tokens = PUBLISHED[self.name]["tokens_per_query"]
        return tokens["mean"], tokens["p50"], tokens["p95"]

    @property
    def retrieval_mean_s(self) -> float:
        return PUBLISHED[self.name]["retrieval_latency_s"]["mean"]

    @property
    def gap_median_s(self) -> float:
        # rounded to the microsecond, so that 700.7 ms is exactly 0.7007 s
        return round(PUBLISHED[self.name]["inter_chunk_arrival_ms"]["median"] / 1000, 6)

    def describe(self) -> dict[str, Any]:
        mu, below, above = fit_split_lognormal(*self.tokens)
        return {"tokens_per_query": f"split lognormal(median {math.exp(mu):.0f}, sigma {below:.3f} below "
                                    f"and {above:.3f} above it)",
                "chunks_per_query": self.chunks_note,
                "inter_chunk_gap_s": f"lognormal(median {self.gap_median_s}, sigma {self.gap_sigma})",
                "first_chunk_s": f"lognormal(sigma {self.first_sigma}), scaled so the mean retrieval time "
                                 f"is {self.retrieval_mean_s} s"}


MODELS = {
    "crawler": WorkloadModel(
        "crawler", "append", 1.0, 0.8, _crawler_chunks,
        "round(lognormal(median 8, sigma 0.3)) within [2, 20], one page per chunk"),
    "anns": WorkloadModel(
        "anns", "update", 1.4, 0.5, _anns_chunks,
        f"1 + geometric(p {_ANNS_GEOMETRIC_P}) within [1, 16], each the full top-k list"),
}
WORKLOADS = tuple(MODELS)
