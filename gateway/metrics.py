"""Prometheus metrics of the gateway (one registry per app), served at `GET /metrics`.

    streamrag_gateway_requests_total{route, status}   every HTTP request and WebSocket, by route
                                                      template ("unmatched" for unknown paths)
    streamrag_gateway_ttft_seconds{route, kind}       request arrival to the first token;
                                                      kind: rag (Ask), plain (Generate), realtime
    streamrag_gateway_shed_total                      requests answered 503 with Retry-After: not started
                                                      within their tenant's max_queue_s

It also keeps when the last request was shed: the service is saturated for `SATURATED_S` after.
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

SATURATED_S = 60.0
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter("streamrag_gateway_requests", "Gateway requests by route and HTTP status",
                                ["route", "status"], registry=self.registry)
        self.ttft = Histogram("streamrag_gateway_ttft_seconds", "From the request's arrival to its first token",
                              ["route", "kind"], buckets=BUCKETS, registry=self.registry)
        self.shed = Counter("streamrag_gateway_shed", "Requests answered 503 with Retry-After (not started in time)",
                            registry=self.registry)
        self.last_shed: float | None = None

    def note_shed(self) -> None:
        self.shed.inc()
        self.last_shed = time.monotonic()

    def saturation(self) -> dict:
        """`saturated` (a request shed in the last `SATURATED_S`) and seconds since the last one shed."""
        since = None if self.last_shed is None else time.monotonic() - self.last_shed
        return {"saturated": since is not None and since < SATURATED_S,
                "last_shed_s_ago": None if since is None else round(since, 1)}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
