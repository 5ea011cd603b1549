"""One whole stack for the gateway suite (model, index, retrievers, Redis: a few seconds), with:

- `gateway`: a gateway with no keys in front of the stack's orchestrator and replica;
- `secure`: an orchestrator that wants an API key over mutual TLS (on the same replica,
  retrievers and Redis), and a gateway that wants the key, serves HTTPS and dials it with mTLS,
  all with certificates made by scripts/make_certs.sh.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest

from gateway.app import GatewaySettings
from orchestrator.server import OrchestratorService
from protos import inference_pb2
from servicekit.config import ServiceConfig
from tests.e2e.stack_harness import Stack
from tests.gateway.harness import RunningGateway, make_certs, tls_files

API_KEY = "sk-streamrag-test-key"


@pytest.fixture(scope="package")
def gateway_stack(embedded_model_dir, tmp_path_factory):
    stack = Stack(embedded_model_dir, tmp_path_factory.mktemp("gateway-stack"))
    yield stack
    stack.stop()


@pytest.fixture(scope="package")
def gateway(gateway_stack):
    running = RunningGateway(GatewaySettings(orchestrator=f"127.0.0.1:{gateway_stack.orchestrator_port}",
                                             inference=(gateway_stack.inference.address,)))
    yield running
    running.stop()


@pytest.fixture
def client(gateway):
    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="not-needed", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="package")
def served_model(gateway_stack) -> str:
    return gateway_stack.inference.stub.Describe(inference_pb2.DescribeRequest(), timeout=30).model_info.model


@dataclass
class Secure:
    certs: Path
    orchestrator: str          # host:port, API key + mutual TLS
    gateway: RunningGateway    # API key + HTTPS, mTLS to the orchestrator

    def grpc_channel(self, *, client_cert: bool = True) -> grpc.Channel:
        credentials = tls_files(self.certs, "client").channel_credentials() if client_cert else \
            grpc.ssl_channel_credentials(root_certificates=(self.certs / "ca.crt").read_bytes())
        return grpc.secure_channel(self.orchestrator, credentials)


@pytest.fixture(scope="package")
def secure(gateway_stack, tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    stack = gateway_stack

    async def start():
        service = OrchestratorService(ServiceConfig("orchestrator", port=0, metrics_port=None, grace_s=0),
                                      redis_url=stack.redis.url, inference=[stack.inference.address],
                                      retrievers=stack.retriever_addresses, api_keys=(API_KEY,),
                                      tls=tls_files(certs, "orchestrator"))
        return service, await service.start(handle_signals=False)

    service, port = stack._run(start())
    running = None
    try:
        # The gateway dials every service with TLS once it has a CA: here only the orchestrator serves
        # TLS, so this gateway is for RAG requests (the stack's replica speaks plaintext).
        running = RunningGateway(GatewaySettings(orchestrator=f"127.0.0.1:{port}",
                                                 inference=(stack.inference.address,), api_keys=(API_KEY,),
                                                 upstream_tls=tls_files(certs, "gateway")),
                                 tls=tls_files(certs, "gateway"))
        yield Secure(certs, f"127.0.0.1:{port}", running)
    finally:
        if running is not None:
            running.stop()
        stack._run(service.stop(0))
