"""A saturated service says so: the gateway's /health after it shed a request (503 with Retry-After),
and `streamrag status`'s line for the gateway, which reads it."""

from __future__ import annotations

from types import SimpleNamespace

import httpx

from gateway.app import GatewaySettings
from streamrag.stack.commands import gateway_saturation
from tests.support.gateway import RunningGateway
from tests.support.redis_server import free_port


def test_health_and_status_say_when_the_gateway_shed_requests_lately():
    running = RunningGateway(GatewaySettings(orchestrator=f"127.0.0.1:{free_port()}"))   # no orchestrator needed
    try:
        service = SimpleNamespace(target=f"{running.base_url}/health")
        health = httpx.get(service.target, timeout=30).json()
        assert health["status"] == "ok" and health["saturated"] is False
        assert gateway_saturation(service, {"tls_dir": None}, 5.0) == ""
        running.app.state.metrics.note_shed()
        health = httpx.get(service.target, timeout=30).json()
        assert health["saturated"] is True and health["last_shed_s_ago"] >= 0
        assert "SATURATED" in gateway_saturation(service, {"tls_dir": None}, 5.0)
    finally:
        running.stop()
