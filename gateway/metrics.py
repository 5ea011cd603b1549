"""Prometheus metrics of the gateway (one registry per app), served at `GET /metrics`.

    streamrag_gateway_requests_total{route, status}   every HTTP request and WebSocket, by route
                                                      template ("unmatched" for unknown paths)
    streamrag_gateway_ttft_seconds{route, kind}       request arrival to the first token;
                                                      kind: rag (Ask), plain (Generate), realtime
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter("streamrag_gateway_requests", "Gateway requests by route and HTTP status",
                                ["route", "status"], registry=self.registry)
        self.ttft = Histogram("streamrag_gateway_ttft_seconds", "From the request's arrival to its first token",
                              ["route", "kind"], buckets=BUCKETS, registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
