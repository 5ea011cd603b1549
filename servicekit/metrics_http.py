"""The Prometheus metrics endpoint of every service, always in the text format (version 0.0.4).

prometheus_client answers a scraper that asks for OpenMetrics 1.0.0 without naming an escaping
scheme (Prometheus 2.x does) with `escaping=underscores`, and in that mode it rewrites the colons
of sample names (`vllm:num_requests_waiting` is stored as `vllm_num_requests_waiting`), though a
colon is a legal character of a metric name (prometheus/client_python issue 1177). The text format
never rewrites a name, and every Prometheus reads it, so the endpoint answers in it whatever the
scraper asks: a query for `vllm:num_requests_waiting` finds what the replica exposes.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

TEXT_FORMAT = "text/plain; version=0.0.4"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:   # a scrape a second: no access log
        pass


def start_metrics_server(port: int, host: str, registry: CollectorRegistry) -> ThreadingWSGIServer:
    """Serve `registry` on http://host:port/metrics (any path) from a daemon thread; `shutdown()` and
    `server_close()` the returned server to stop it. Port 0 picks a free one (`server_port`)."""
    app = make_wsgi_app(registry)

    def text_only(environ, start_response):
        return app({**environ, "HTTP_ACCEPT": TEXT_FORMAT}, start_response)

    server = make_server(host, port, text_only, ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name=f"metrics-{server.server_port}", daemon=True).start()
    return server
