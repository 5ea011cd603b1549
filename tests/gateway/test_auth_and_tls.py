"""API keys on the gateway and on the orchestrator's gRPC, TLS on the gateway and between the
gateway and the orchestrator, with certificates made by scripts/make_certs.sh (mutual TLS on
every hop: test_mutual_tls.py)."""

from __future__ import annotations

import ssl
import uuid

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gateway.protocol import RAG_MODEL
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.auth import bearer_metadata
from tests.gateway.conftest import API_KEY

ASK = {"model": RAG_MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": "How do I read a file?"}]}


def _trusting(secure) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(secure.certs / "ca.crt"))


def _secure_client(secure, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{secure.gateway.base_url}/v1", api_key=key, max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpxClient(verify=_trusting(secure)))


@pytest.mark.parametrize("headers", [{}, {"Authorization": f"Bearer {API_KEY}x"}, {"Authorization": f"Basic {API_KEY}"},
                                     {"Authorization": "Bearer"}], ids=["none", "wrong", "not-bearer", "empty"])
def test_the_gateway_answers_401_without_a_valid_key_and_does_no_work(secure, gateway_stack, headers):
    before = gateway_stack.inference.stats().counters.requests_received
    response = httpx.post(f"{secure.gateway.base_url}/v1/chat/completions", json=ASK, headers=headers,
                          verify=_trusting(secure), timeout=30)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert gateway_stack.inference.stats().counters.requests_received == before


def test_health_and_metrics_need_no_key(secure):
    for path in ("/health", "/metrics"):
        assert httpx.get(f"{secure.gateway.base_url}{path}", verify=_trusting(secure), timeout=30).status_code == 200


def test_the_openai_client_with_the_key_gets_an_answer_over_https_and_tls(secure):
    with _secure_client(secure, API_KEY) as client:
        response = client.chat.completions.create(**ASK)
    assert response.choices[0].message.content and response.model_extra["streamrag"]["sources"]
    with _secure_client(secure, "sk-wrong") as client, pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(**ASK)


def test_a_client_that_does_not_trust_the_ca_cannot_connect(secure):
    with openai.OpenAI(base_url=f"{secure.gateway.base_url}/v1", api_key=API_KEY, max_retries=0,
                       timeout=30) as client, pytest.raises(openai.APIConnectionError):
        client.models.list()


def test_the_websocket_handshake_wants_the_key(secure):
    url = secure.gateway.ws_url
    with pytest.raises(InvalidStatus) as caught:
        connect(url, ssl=_trusting(secure), open_timeout=30)
    assert caught.value.response.status_code == 401
    with connect(url, ssl=_trusting(secure), additional_headers={"Authorization": f"Bearer {API_KEY}"},
                 open_timeout=30) as ws:
        assert '"session.created"' in ws.recv(timeout=30)


def test_the_orchestrator_wants_a_key_over_grpc(secure, gateway_stack):
    request_id = uuid.uuid4().hex
    ask = orchestrator_pb2.AskRequest(question="How do I read a file?", max_tokens=4, request_id=request_id)
    before = gateway_stack.inference.stats().counters.requests_received
    with secure.grpc_channel() as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        for metadata in ((), bearer_metadata("wrong"), (("authorization", API_KEY),)):
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Ask(ask, metadata=metadata, timeout=30))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert gateway_stack.inference.stats().counters.requests_received == before
        with pytest.raises(grpc.RpcError) as caught:        # the refused Ask left no record
            stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=request_id),
                            metadata=bearer_metadata(API_KEY), timeout=30)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        events = list(stub.Ask(ask, metadata=bearer_metadata(API_KEY), timeout=120))
        assert events[-1].event.done.request_id == request_id
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
