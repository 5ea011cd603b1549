"""A saturated orchestrator says so: after it shed a request (not started within its tenant's `max_queue_s`),
its metrics say `streamrag_orchestrator_saturated{reason="shedding"} 1`, and while every replica it reaches
is overloaded, `{reason="replicas_overloaded"} 1`; `streamrag status`'s line for the orchestrator, which
reads them, says SATURATED and why (orchestrator/admission.py, metrics.py).

Real parts: one fp32 replica (behind a gate that holds the answer before its first token, for shedding),
Redis, an orchestrator process with a tenants file and a metrics port."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import httpx
import pytest

from protos import common_pb2, inference_pb2, inference_pb2_grpc
from servicekit.auth import bearer_metadata
from streamrag.stack.commands import service_details
from streamrag.stack.plan import Service
from tests.support.gated_world import gated_world
from tests.support.inference import RunningInference
from tests.support.inference_calls import finish_msg, open_msg
from tests.support.orchestrator import OrchestratorProcess
from tests.support.redis_server import PrivateRedis, free_port

TENANTS = """
[tenants.hasty]
keys = ["hasty-key"]
max_queue_s = 1
"""


@pytest.fixture
def world(embedded_model_dir, tmp_path):
    with gated_world(embedded_model_dir, tmp_path) as w:
        (tmp_path / "tenants.toml").write_text(TENANTS)
        metrics_port = free_port()
        orchestrator = w.parts.add(OrchestratorProcess(
            w.redis.url, [w.gate.address], log_path=tmp_path / "orchestrator.log",
            args=("--tenants", str(tmp_path / "tenants.toml"), "--metrics-port", str(metrics_port))))
        yield w.gate, orchestrator, Service("orchestrator", "orchestrator", orchestrator.address, None,
                                            ports=[orchestrator.port, metrics_port])


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


def until(condition, what: str, timeout_s: float = 120.0) -> None:
    """Wait for `condition` (a bound, not a timing assert: the router reads replica stats every second)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.1)


def test_metrics_and_status_say_when_every_replica_is_overloaded(embedded_model_dir, tmp_path):
    """A replica that serves one stream at a time, holding an open streamed prompt, is overloaded (its load,
    active streams over its maximum, is past the router's threshold): the orchestrator is saturated for
    `replicas_overloaded` until the stream ends, and sheds nothing meanwhile."""
    parts: list = []
    messages: queue.Queue = queue.Queue()
    call = None
    try:
        parts.append(PrivateRedis(tmp_path))
        replica = RunningInference(embedded_model_dir, kv_device_blocks=128, token_budget=256, max_streams=1)
        parts.append(replica)
        metrics_port = free_port()
        orchestrator = OrchestratorProcess(parts[0].url, [replica.address], log_path=tmp_path / "orchestrator.log",
                                           args=("--metrics-port", str(metrics_port)))
        parts.append(orchestrator)
        service = Service("orchestrator", "orchestrator", orchestrator.address, None,
                          ports=[orchestrator.port, metrics_port])
        options = {"replicas": 1}
        until(lambda: saturated(service) == {"shedding": 0.0, "replicas_overloaded": 0.0}, "a calm orchestrator")
        assert "SATURATED" not in service_details(service, options, 5.0)

        messages.put(open_msg("holds-the-replica", [common_pb2.Segment(text="A prompt still arriving")]))
        call = replica.stub.StreamPrompt(iter(messages.get, None), timeout=300)   # open until finished
        answers = threading.Thread(target=lambda: list(call), daemon=True)
        answers.start()
        until(lambda: replica.stats().num_active == 1, "the open stream on the replica")
        until(lambda: saturated(service)["replicas_overloaded"] == 1.0, "replicas_overloaded in the metrics")
        assert saturated(service)["shedding"] == 0.0
        details = service_details(service, options, 5.0)
        assert "SATURATED: every inference replica is overloaded" in details, details
        assert "requests shed" not in details

        messages.put(finish_msg(common_pb2.Segment(text=" ends here.")))
        messages.put(None)
        answers.join(120)
        until(lambda: saturated(service)["replicas_overloaded"] == 0.0, "the replica no longer overloaded")
        assert "SATURATED" not in service_details(service, options, 5.0)
    finally:
        messages.put(None)
        if call is not None:
            call.cancel()
        for part in reversed(parts):
            part.stop()
