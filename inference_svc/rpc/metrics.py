"""Prometheus metrics of the inference service (one registry per service instance).

Both backends expose the same names. The servicer records calls (TTFT, open streams, errors);
the native service also reads its engine after every step (`native.metrics.StepMetrics`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class InferenceMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("streamrag_ttft_seconds", "Time to first token", ["since"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.step_latency = Histogram("streamrag_engine_step_seconds", "Engine step latency",
                                      buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                                      registry=r)
        self.requests = Gauge("streamrag_requests", "Requests by engine state", ["state"], registry=r)
        self.open_streams = Gauge("streamrag_open_streams", "Open StreamPrompt/Generate calls", registry=r)
        self.kv_blocks = Gauge("streamrag_kv_blocks", "KV blocks per pool", ["pool", "kind"], registry=r)
        self.preemptions = Counter("streamrag_preemptions", "Preemptions by kind", ["kind"], registry=r)
        self.tokens_invalidated = Counter("streamrag_tokens_invalidated", "KV tokens dropped by updates", registry=r)
        self.prefix_hits = Gauge("streamrag_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
                                 registry=r)
        self.chunk_captures_skipped = Gauge("streamrag_chunk_captures_skipped",
                                            "Blend mode: passages not captured into the chunk store for lack of "
                                            "free KV blocks, since the service started", registry=r)
        self.generated = Counter("streamrag_generated_tokens", "Generated tokens", registry=r)
        self.draft_tokens = Counter("streamrag_draft_tokens", "Speculative decoding: drafted tokens verified",
                                    registry=r)
        self.accepted_draft_tokens = Counter("streamrag_accepted_draft_tokens",
                                             "Speculative decoding: drafted tokens accepted", registry=r)
        self.draft_acceptance = Gauge("streamrag_draft_acceptance",
                                      "Speculative decoding: accepted / drafted tokens since the service started",
                                      registry=r)
        self.draft_depth = Histogram("streamrag_draft_depth", "Speculative decoding: draft depth per request and step",
                                     buckets=(1, 2, 3, 4, 6, 8, 12, 16), registry=r)
        self.sessions = Gauge("streamrag_sessions", "Open sessions (the Sessions service)", registry=r)
        self.session_queries = Counter("streamrag_session_queries", "Session queries by how they were answered",
                                       ["answer"], registry=r)    # "flash" (cached) or "forked" (computed)
        self.flash_answers = Counter("streamrag_flash_answers", "Flash Query answers computed", registry=r)
        self.rpc_errors = Counter("streamrag_rpc_errors", "RPCs ended with an error status", ["code"], registry=r)
