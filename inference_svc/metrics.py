"""Prometheus metrics of the inference service (one registry per service instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inference_svc.engine.engine import Engine
from inference_svc.engine.events import EngineEvent, EventKind

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
        self._drafts_seen = (0, 0)
        self.sessions = Gauge("streamrag_sessions", "Open sessions (the Sessions service)", registry=r)
        self.session_queries = Counter("streamrag_session_queries", "Session queries by how they were answered",
                                       ["answer"], registry=r)    # "flash" (cached) or "forked" (computed)
        self.flash_answers = Counter("streamrag_flash_answers", "Flash Query answers computed", registry=r)
        self.rpc_errors = Counter("streamrag_rpc_errors", "RPCs ended with an error status", ["code"], registry=r)

    def observe(self, engine: Engine, seconds: float | None, events: list[EngineEvent]) -> None:
        """Called on the engine thread after each step (seconds) and after commands (None)."""
        if seconds is not None:
            self.step_latency.observe(seconds)
            for depth in engine.last_step_depths:
                self.draft_depth.observe(depth)
        self._observe_drafts(engine.counters.draft_tokens, engine.counters.accepted_draft_tokens)
        for event in events:
            if event.kind is EventKind.PREEMPTED_SWAP:
                self.preemptions.labels("swap").inc()
            elif event.kind is EventKind.PREEMPTED_RECOMPUTE:
                self.preemptions.labels("recompute").inc()
            elif event.kind is EventKind.INVALIDATED:
                self.tokens_invalidated.inc(event.count)
            elif event.kind is EventKind.TOKEN:
                self.generated.inc()
        counts = {"running": 0, "waiting": 0, "swapped": 0}
        for request in list(engine.requests.values()):
            if request.state.value in counts:
                counts[request.state.value] += 1
        for state, n in counts.items():
            self.requests.labels(state).set(n)
        for pool in engine.scheduler.pools():
            self.kv_blocks.labels(pool.name, "total").set(pool.num_blocks)
            self.kv_blocks.labels(pool.name, "free").set(pool.num_free)
        self.prefix_hits.set(engine.counters.prefix_cache_hit_tokens)

    def _observe_drafts(self, drafted: int, accepted: int) -> None:
        seen_drafted, seen_accepted = self._drafts_seen
        if drafted > seen_drafted:
            self.draft_tokens.inc(drafted - seen_drafted)
            self.accepted_draft_tokens.inc(accepted - seen_accepted)
            self.draft_acceptance.set(accepted / drafted)
            self._drafts_seen = (drafted, accepted)
