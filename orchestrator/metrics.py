"""Prometheus metrics of the orchestrator (one registry per service instance)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from orchestrator.recording import continuation_counts

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
        # Per tenant (servicekit/tenants.py; "" on a service without keys): every request the orchestrator
        # serves (Ask, plain Generate, StreamPrompt) by outcome, its tokens, first-token time and refusals.
        self.tenant_requests = Counter("streamrag_tenant_requests", "Requests by tenant and outcome",
                                       ["tenant", "outcome"], registry=r)
        self.tenant_tokens = Counter("streamrag_tenant_tokens", "Tokens served by tenant (prompt, generated)",
                                     ["tenant", "kind"], registry=r)
        self.tenant_ttft = Histogram("streamrag_tenant_ttft_seconds", "First answer token after the request, by tenant",
                                     ["tenant"], buckets=BUCKETS, registry=r)
        self.tenant_rejections = Counter("streamrag_tenant_rejections", "Requests refused by tenant and reason "
                                         "(a limit's name, or queue_timeout)", ["tenant", "reason"], registry=r)
        self.retrieval = Histogram("streamrag_ask_retrieval_seconds", "Retrieval time", ["mode"], buckets=BUCKETS,
                                   registry=r)

    def watch_store(self, store: Any) -> None:
        """Export the lifecycle store's own counters (read at each scrape)."""
        self.registry.register(_StoreCollector(store))

    def watch_saturation(self, saturation: Callable[[], dict]) -> None:
        """Export whether the orchestrator is saturated (admission.py's `TenantGate.saturation`, read at each
        scrape): `streamrag_orchestrator_saturated{reason="shedding"|"replicas_overloaded"}` 0 or 1, and
        `streamrag_orchestrator_last_shed_seconds_ago` once a request was shed."""
        self.registry.register(_SaturationCollector(saturation))


SATURATED = "streamrag_orchestrator_saturated"
LAST_SHED = "streamrag_orchestrator_last_shed_seconds_ago"


class _SaturationCollector:
    def __init__(self, saturation: Callable[[], dict]) -> None:
        self.saturation = saturation

    def collect(self) -> Any:
        now = self.saturation()
        saturated = GaugeMetricFamily(SATURATED, "1 while the orchestrator is saturated, by reason: it shed a "
                                      "request lately (not started within its tenant's max_queue_s), or every "
                                      "replica is overloaded", labels=["reason"])
        for reason in ("shedding", "replicas_overloaded"):
            saturated.add_metric([reason], float(now[reason]))
        yield saturated
        if now["last_shed_s_ago"] is not None:
            yield GaugeMetricFamily(LAST_SHED, "Seconds since the orchestrator last shed a request",
                                    value=now["last_shed_s_ago"])


class _StoreCollector:
    """`streamrag_lifecycle_*`: writes the lifecycle store lost, had refused, holds, or stored on a
    primary that no replica acknowledged (terminal writes over a Sentinel set, `WAIT 1` timed out)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def collect(self) -> Any:
        s = self.store
        yield CounterMetricFamily("streamrag_lifecycle_dropped_writes", "Writes lost to the buffer bound",
                                  value=s.dropped)
        yield CounterMetricFamily("streamrag_lifecycle_write_errors", "Writes Redis refused", value=s.write_errors)
        yield CounterMetricFamily("streamrag_lifecycle_unreplicated_writes",
                                  "Terminal writes no replica acknowledged within the WAIT timeout",
                                  value=getattr(s, "unreplicated", 0))
        yield GaugeMetricFamily("streamrag_lifecycle_pending_writes", "Writes not yet stored in Redis",
                                value=s.pending)
        kept = CounterMetricFamily("streamrag_ask_continuations", "Answers kept going after a break, by cause: "
                                   "RETRIED (re-issued before the first token), RESUMED (re-issued after it), "
                                   "CONTINUED (moved to another replica mid-answer)", labels=["cause"])
        counts = continuation_counts(s)
        for cause in ("RETRIED", "RESUMED", "CONTINUED"):
            kept.add_metric([cause], counts.get(cause, 0))
        yield kept
