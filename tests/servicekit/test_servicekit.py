"""The shared service plumbing: health, reflection, metrics, SIGTERM, env configuration."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from prometheus_client import CollectorRegistry, Counter

from protos import inference_pb2, inference_pb2_grpc
from servicekit.config import ServiceConfig, add_service_args, service_config_from_args
from servicekit.server import ServiceRunner

REPO = Path(__file__).resolve().parents[2]
INFERENCE = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name


@pytest.fixture
async def runner():
    registry = CollectorRegistry()
    Counter("plumbing_test_requests", "a counter the test looks for", registry=registry).inc(3)
    runner = ServiceRunner(
        ServiceConfig(service="inference", port=0, metrics_port=0),
        [(inference_pb2_grpc.add_InferenceServicer_to_server, inference_pb2_grpc.InferenceServicer())],
        [INFERENCE],
        registry=registry,
    )
    await runner.start(handle_signals=False)
    yield runner
    await runner.stop(0)


async def test_health_check_reports_serving_for_server_and_service(runner):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{runner.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", INFERENCE):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def _reflect(port: int) -> tuple[set[str], set[str]]:
    """Blocking reflection client (run off the event loop that serves the aio server)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        methods = {m.name for m in DescriptorPool(db).FindServiceByName(INFERENCE).methods}
    return services, methods


async def test_reflection_lists_the_service_and_resolves_its_methods(runner):
    services, methods = await asyncio.to_thread(_reflect, runner.port)
    assert {INFERENCE, "grpc.health.v1.Health"} <= services
    assert {"StreamPrompt", "Generate", "Describe", "GetStats"} <= methods


async def test_metrics_endpoint_serves_the_registry(runner):
    url = f"http://127.0.0.1:{runner.metrics_port}/metrics"
    body = (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
    assert "plumbing_test_requests_total 3.0" in body


async def test_stop_flips_health_and_closes_the_port(runner):
    port = runner.port
    await runner.stop(0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_sigterm_stops_the_server_gracefully():
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.plumbing_server"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT"), proc.stderr.read()
        port = int(line.split()[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert "STOPPED" in proc.stdout.read()
    finally:
        proc.kill()


def _parse(argv: list[str]) -> ServiceConfig:
    parser = argparse.ArgumentParser()
    add_service_args(parser, "anns")
    return service_config_from_args("anns", parser.parse_args(argv))


def test_config_defaults_env_and_flags_in_order_of_precedence(monkeypatch):
    assert _parse([]).port == 50061
    assert _parse([]).metrics_port == 9102
    monkeypatch.setenv("STREAMRAG_ANNS_PORT", "50099")
    assert _parse([]).port == 50099
    assert _parse(["--port", "50100"]).port == 50100
    assert _parse(["--metrics-port", "-1"]).metrics_port is None


def test_config_rejects_a_malformed_environment_value(monkeypatch):
    monkeypatch.setenv("STREAMRAG_ANNS_PORT", "not-a-port")
    with pytest.raises(SystemExit, match="STREAMRAG_ANNS_PORT"):
        _parse([])
