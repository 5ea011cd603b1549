"""The native engine's metrics under vLLM's names, beside the `streamrag_*` ones, so what reads a
vLLM replica (production-stack's router, a KEDA trigger on `vllm:num_requests_waiting`, vLLM's
Grafana dashboards) reads a native replica unchanged.

Every metric carries vLLM's labels, `model_name` (the served model: `ModelInfo.model`) and
`engine` ("0": one engine per replica). Counters are declared as vLLM declares them
(`vllm:prompt_tokens`, `vllm:prefix_cache_queries`, ...), so prometheus_client exposes them as
vLLM does: `vllm:prompt_tokens_total`, `vllm:prefix_cache_queries_total`.

What each one counts here:
- `vllm:num_requests_running`: requests in the running set; `vllm:num_requests_waiting`: waiting
  to be scheduled, swapped-out requests included (they wait for memory, as the router's queue
  depth counts them); `vllm:kv_cache_usage_perc`: used / total blocks of the device KV pool (0-1).
- `vllm:prompt_tokens`: prompt tokens prefilled, computed or found in the prefix cache;
  `vllm:prefix_cache_queries` the same tokens (each looked up in the prefix cache), and
  `vllm:prefix_cache_hits` those found there; `vllm:generation_tokens`: tokens generated;
  `vllm:num_preemptions`: preemptions, swap and recompute; `vllm:request_success`: requests
  finished, by `finished_reason` (stop, length, abort).
- Histograms, in seconds from the request's arrival (its QUEUED event): time to first token,
  end to end (FINISHED), time in the queue (first SCHEDULED); and between two tokens of one answer.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inference_svc.engine.engine import Engine
from inference_svc.engine.events import EngineEvent, EventKind

LABELS = ("model_name", "engine")
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
SUCCESS_REASONS = ("stop", "length", "abort")


class VllmMetrics:
    """Reads the engine after each step (on the engine thread, from `StepMetrics.observe`)."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = (model_name, "0")

        def make(kind, name: str, doc: str, **options):
            return kind(name, doc, LABELS, registry=registry, **options).labels(*labels)

        self.running = make(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = make(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = make(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = make(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = make(Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = make(Counter, "vllm:prefix_cache_queries",
                                   "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = make(Counter, "vllm:prefix_cache_hits",
                                "Prefix cache hits, in terms of number of cached tokens.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          (*LABELS, "finished_reason"), registry=registry)
        self.success = {reason: success.labels(*labels, reason) for reason in SUCCESS_REASONS}
        self.ttft = make(Histogram, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         buckets=TTFT_BUCKETS)
        self.itl = make(Histogram, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        buckets=ITL_BUCKETS)
        self.e2e = make(Histogram, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        buckets=REQUEST_BUCKETS)
        self.queue_time = make(Histogram, "vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", buckets=REQUEST_BUCKETS)
        self._seen: dict[str, int] = {}
        self._arrived: dict[str, float] = {}        # request -> its QUEUED time, until it finishes
        self._last_token: dict[str, float] = {}
        self._scheduled: set[str] = set()

    def observe(self, engine: Engine, counts: dict[str, int], events: list[EngineEvent]) -> None:
        """`counts`: requests by state ("running", "waiting", "swapped"), as StepMetrics counted them."""
        self.running.set(counts["running"])
        self.waiting.set(counts["waiting"] + counts["swapped"])
        for pool in engine.scheduler.pools():
            if pool.name == "device" and pool.num_blocks > 0:
                self.kv_usage.set(1 - pool.num_free / pool.num_blocks)
        c = engine.counters
        self._add(self.prompt_tokens, "prompt", c.prompt_tokens_computed + c.prefix_cache_hit_tokens)
        self._add(self.prefix_queries, "queries", c.prompt_tokens_computed + c.prefix_cache_hit_tokens)
        self._add(self.prefix_hits, "hits", c.prefix_cache_hit_tokens)
        self._add(self.generation_tokens, "generated", c.generated_tokens)
        self._add(self.preemptions, "preemptions", c.preemptions_swap + c.preemptions_recompute)
        for event in events:
            self._on_event(event)

    def _add(self, counter: Counter, key: str, total: int) -> None:
        seen = self._seen.get(key, 0)
        if total > seen:
            counter.inc(total - seen)
            self._seen[key] = total

    def _on_event(self, event: EngineEvent) -> None:
        rid, kind, at = event.request_id, event.kind, event.time
        if kind is EventKind.QUEUED:
            self._arrived.setdefault(rid, at)
            return
        arrived = self._arrived.get(rid)
        if arrived is None:
            return
        if kind is EventKind.SCHEDULED and rid not in self._scheduled:
            self._scheduled.add(rid)
            self.queue_time.observe(at - arrived)
        elif kind is EventKind.FIRST_TOKEN:
            self.ttft.observe(at - arrived)
        elif kind is EventKind.TOKEN:
            last = self._last_token.get(rid)
            if last is not None:
                self.itl.observe(at - last)
            self._last_token[rid] = at
        elif kind in (EventKind.FINISHED, EventKind.ERROR):
            if kind is EventKind.FINISHED:
                self.e2e.observe(at - arrived)
                if event.detail in self.success:
                    self.success[event.detail].inc()
            self._arrived.pop(rid, None)
            self._last_token.pop(rid, None)
            self._scheduled.discard(rid)
