"""A saturated orchestrator says so: after it shed a request (not started within its tenant's `max_queue_s`),
its metrics say `streamrag_orchestrator_saturated{reason="shedding"} 1`, and `streamrag status`'s line for
the orchestrator, which reads them, says SATURATED (orchestrator/admission.py, metrics.py).

Real parts: one fp32 replica behind a gate that holds the answer before its first token, Redis, an
orchestrator process with a tenants file and a metrics port."""

from __future__ import annotations

import grpc
import httpx
import pytest

from protos import inference_pb2, inference_pb2_grpc
from servicekit.auth import bearer_metadata
from streamrag.stack.commands import service_details
from streamrag.stack.plan import Service
from tests.support.inference import RunningInference
from tests.support.inference_gate import InferenceGate
from tests.support.orchestrator import OrchestratorProcess
from tests.support.redis_server import PrivateRedis, free_port

TENANTS = """
[tenants.hasty]
keys = ["hasty-key"]
max_queue_s = 1
"""


@pytest.fixture
def world(embedded_model_dir, tmp_path):
    parts: list = []
    try:
        parts.append(PrivateRedis(tmp_path))
        replica = RunningInference(embedded_model_dir, kv_device_blocks=128, token_budget=256)
        parts.append(replica)
        gate = InferenceGate(replica.address)
        parts.append(gate)
        (tmp_path / "tenants.toml").write_text(TENANTS)
        metrics_port = free_port()
        orchestrator = OrchestratorProcess(parts[0].url, [gate.address], log_path=tmp_path / "orchestrator.log",
                                           args=("--tenants", str(tmp_path / "tenants.toml"),
                                                 "--metrics-port", str(metrics_port)))
        parts.append(orchestrator)
        yield gate, orchestrator, Service("orchestrator", "orchestrator", orchestrator.address, None,
                                          ports=[orchestrator.port, metrics_port])
    finally:
        for part in reversed(parts):
            part.stop()


def saturated(service: Service) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{service.ports[1]}/metrics", timeout=30).text
    return {line.split("reason=\"")[1].split("\"")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("streamrag_orchestrator_saturated{")}


def test_metrics_and_status_say_when_the_orchestrator_shed_requests_lately(world):
    gate, orchestrator, service = world
    options = {"replicas": 1}
    assert saturated(service) == {"shedding": 0.0, "replicas_overloaded": 0.0}
    assert "SATURATED" not in service_details(service, options, 5.0)

    gate.arm(0)                                     # the answer never starts: shed after max_queue_s
    try:
        stub = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(orchestrator.address))
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Generate(inference_pb2.GenerateRequest(segments=[{"text": "Hello"}],
                                                             sampling={"max_tokens": 4}),
                               timeout=120, metadata=bearer_metadata("hasty-key")))
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "max_queue_s" in raised.value.details()
    finally:
        gate.release()

    assert saturated(service)["shedding"] == 1.0
    details = service_details(service, options, 5.0)
    assert "SATURATED: requests shed" in details and "s ago" in details, details
