"""The native engine's side of the service metrics: after each step (and after commands that
raised events), read the engine into the service's `InferenceMetrics`, and into the same figures
under vLLM's names (`native.vllm_metrics`)."""

from __future__ import annotations

from prometheus_client import Gauge

from inference_svc.engine.engine import Engine
from inference_svc.engine.events import EngineEvent, EventKind
from inference_svc.native.vllm_metrics import VllmMetrics
from inference_svc.rpc.metrics import InferenceMetrics


class StepMetrics:
    def __init__(self, metrics: InferenceMetrics, model_name: str = "") -> None:
        self.metrics = metrics
        self.vllm = VllmMetrics(metrics.registry, model_name)
        self._drafts_seen = (0, 0)
        # the native engine's own: the last step's token budget (below --token-budget when bounded in time)
        self.step_budget = Gauge("streamrag_engine_step_token_budget", "Token budget of the last engine step",
                                 registry=metrics.registry)

    def observe(self, engine: Engine, seconds: float | None, events: list[EngineEvent]) -> None:
        """Called on the engine thread after each step (seconds) and after commands (None)."""
        m = self.metrics
        if seconds is not None:
            m.step_latency.observe(seconds)
            self.step_budget.set(engine.last_step.budget)
            for depth in engine.last_step.depths:
                m.draft_depth.observe(depth)
        self._observe_drafts(engine.counters.draft_tokens, engine.counters.accepted_draft_tokens)
        for event in events:
            if event.kind is EventKind.PREEMPTED_SWAP:
                m.preemptions.labels("swap").inc()
            elif event.kind is EventKind.PREEMPTED_RECOMPUTE:
                m.preemptions.labels("recompute").inc()
            elif event.kind is EventKind.INVALIDATED:
                m.tokens_invalidated.inc(event.count)
            elif event.kind is EventKind.TOKEN:
                m.generated.inc()
        counts = {"running": 0, "waiting": 0, "swapped": 0}
        for request in list(engine.requests.values()):
            if request.state.value in counts:
                counts[request.state.value] += 1
        for state, n in counts.items():
            m.requests.labels(state).set(n)
        self.vllm.observe(engine, counts, events)
        for pool in engine.scheduler.pools():
            m.kv_blocks.labels(pool.name, "total").set(pool.num_blocks)
            m.kv_blocks.labels(pool.name, "free").set(pool.num_free)
        m.prefix_hits.set(engine.counters.prefix_cache_hit_tokens)
        m.chunk_captures_skipped.set(engine.counters.chunk_captures_skipped)

    def _observe_drafts(self, drafted: int, accepted: int) -> None:
        seen_drafted, seen_accepted = self._drafts_seen
        if drafted > seen_drafted:
            self.metrics.draft_tokens.inc(drafted - seen_drafted)
            self.metrics.accepted_draft_tokens.inc(accepted - seen_accepted)
            self.metrics.draft_acceptance.set(accepted / drafted)
            self._drafts_seen = (drafted, accepted)
