"""Prometheus metrics of the orchestrator (one registry per service instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)


class OrchestratorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.asks = Counter("streamrag_asks", "Ask calls by mode and outcome", ["mode", "outcome"], registry=r)
        self.ttft_question = Histogram("streamrag_ask_ttft_from_question_seconds",
                                       "First answer token after the question", ["mode"], buckets=BUCKETS, registry=r)
        self.ttft_retrieval = Histogram("streamrag_ask_ttft_after_retrieval_seconds",
                                        "First answer token after retrieval ended", ["mode"], buckets=BUCKETS,
                                        registry=r)
        self.retrieval = Histogram("streamrag_ask_retrieval_seconds", "Retrieval time", ["mode"], buckets=BUCKETS,
                                   registry=r)
