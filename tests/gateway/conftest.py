"""One whole stack for the gateway suite (model, index, retrievers, Redis: a few seconds), with:

- `gateway`: a gateway with no keys in front of the stack's orchestrator and replica;
- `secure`: an orchestrator that wants an API key and serves TLS (on the same plaintext replica,
  retrievers and Redis), and a gateway that wants the key, serves HTTPS and dials it with TLS,
  all with certificates made by scripts/make_certs.sh. (Mutual TLS on every hop, each service
  a process of its own: test_mutual_tls.py.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest

from gateway.app import GatewaySettings
from protos import inference_pb2
from tests.support.gateway import RunningGateway, make_certs, tls_files
from tests.support.stack import Stack

API_KEY = "sk-streamrag-test-key"


@pytest.fixture(scope="package")
def gateway_stack(embedded_model_dir, tmp_path_factory):
    stack = Stack(embedded_model_dir, tmp_path_factory.mktemp("gateway-stack"))
    yield stack
    stack.stop()


@pytest.fixture(scope="package")
def gateway(gateway_stack):
    running = RunningGateway(GatewaySettings(orchestrator=f"127.0.0.1:{gateway_stack.orchestrator_port}"))
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
    orchestrator: str          # host:port, API key + TLS
    gateway: RunningGateway    # API key + HTTPS, mTLS to the orchestrator

    def grpc_channel(self) -> grpc.Channel:
        return grpc.secure_channel(self.orchestrator, tls_files(self.certs, "client").channel_credentials())


@pytest.fixture(scope="package")
def secure(gateway_stack, tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    orchestrator = gateway_stack.orchestrate(api_keys=(API_KEY,), tls=tls_files(certs, "orchestrator", ca=False),
                                             client_tls=tls_files(certs, "client"))   # it dials plaintext
    running = None
    try:
        running = RunningGateway(GatewaySettings(orchestrator=orchestrator.address, api_keys=(API_KEY,),
                                                 upstream_tls=tls_files(certs, "gateway")),
                                 tls=tls_files(certs, "gateway"))
        yield Secure(certs, orchestrator.address, running)
    finally:
        if running is not None:
            running.stop()
        orchestrator.stop()
