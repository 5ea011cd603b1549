"""Mutual TLS end to end, every service a process started from its real command line: an
inference replica, the ANNS retriever and the orchestrator, each serving mutual TLS with the
certificates scripts/make_certs.sh makes, the orchestrator and the retriever wanting an API key,
and the gateway serving HTTPS in front. An answer through the gateway, the health probe over TLS,
and callers without a certificate or without a key refused."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import grpc
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.app import GatewaySettings
from gateway.protocol import RAG_MODEL
from protos import orchestrator_pb2, orchestrator_pb2_grpc, retriever_pb2, retriever_pb2_grpc
from servicekit.auth import bearer_metadata
from servicekit.health import check_health
from servicekit.tls import TlsFiles
from tests.retriever import build_tiny_index
from tests.support.gateway import RunningGateway, make_certs, tls_files
from tests.support.inference import InferenceProcess
from tests.support.orchestrator import OrchestratorProcess
from tests.support.redis_server import PrivateRedis
from tests.support.retrievers import RetrieverProcess

KEY = "sk-mtls-test-key"
QUESTION = "How do I read a file?"


def _tls_flags(certs: Path, name: str) -> list[str]:
    return ["--tls-cert", str(certs / f"{name}.crt"), "--tls-key", str(certs / f"{name}.key"),
            "--tls-ca", str(certs / "ca.crt")]


@pytest.fixture(scope="module")
def mtls(embedded_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("mtls")
    certs = make_certs(root / "certs")
    index = build_tiny_index(root)
    keyed = {"STREAMRAG_API_KEY": KEY}
    started: list = []
    redis = PrivateRedis(root)
    client = tls_files(certs, "client")
    try:
        inference = InferenceProcess(embedded_model_dir, client_tls=client,
                                     extra_args=["--kv-device-blocks", "512", *_tls_flags(certs, "inference")])
        started.append(inference)
        anns = RetrieverProcess("anns", root / "anns.log", "--index", str(index), "--collections",
                                str(root / "collections"), *_tls_flags(certs, "anns"), env=keyed, tls=client)
        started.append(anns)
        orchestrator = OrchestratorProcess(redis.url, [inference.address], anns=anns.address,
                                           log_path=root / "orchestrator.log",
                                           args=tuple(_tls_flags(certs, "orchestrator")),
                                           env=keyed, tls=client)
        started.append(orchestrator)
        gateway = RunningGateway(GatewaySettings(orchestrator=orchestrator.address, api_keys=(KEY,),
                                                 upstream_tls=tls_files(certs, "gateway")),
                                 tls=tls_files(certs, "gateway"))
        started.append(gateway)
        yield {"certs": certs, "inference": inference.address, "anns": anns.address,
               "orchestrator": orchestrator.address, "gateway": gateway,
               "logs": {"anns": anns, "orchestrator": orchestrator}}
    finally:
        for part in reversed(started):
            part.stop()
        redis.stop()


def _client(mtls) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{mtls['gateway'].base_url}/v1", api_key=KEY, max_retries=0, timeout=180,
                         http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(
                             cafile=str(mtls["certs"] / "ca.crt"))))


def _channel(mtls, address: str, *, certificate: bool = True) -> grpc.Channel:
    certs = mtls["certs"]
    credentials = tls_files(certs, "client").channel_credentials() if certificate else \
        grpc.ssl_channel_credentials(root_certificates=(certs / "ca.crt").read_bytes())
    return grpc.secure_channel(address, credentials)


def test_the_services_say_they_want_a_key_over_mutual_tls(mtls):
    for name, process in mtls["logs"].items():
        assert any("API key required" in line and "mutual TLS" in line for line in process.log_text().splitlines()), \
            name


def test_an_answer_through_the_gateway_crosses_every_mutual_tls_hop(mtls):
    with _client(mtls) as client:
        rag = client.chat.completions.create(model=RAG_MODEL, max_tokens=8, temperature=0,
                                             messages=[{"role": "user", "content": QUESTION}])
        assert rag.choices[0].message.content
        sources = rag.model_extra["streamrag"]["sources"]
        assert sources and all(source["source"] == "anns" for source in sources)   # the retriever took the key
        model = client.models.list().data[-1].id
        plain = client.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                               messages=[{"role": "user", "content": "Say hi."}])
    assert plain.choices[0].message.content
    with _channel(mtls, mtls["orchestrator"]) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorStub(channel)
        for request_id in (rag.id, plain.id):
            record = stub.GetRequest(orchestrator_pb2.GetRequestRequest(request_id=request_id),
                                     metadata=bearer_metadata(KEY), timeout=30).record
            assert record.state == orchestrator_pb2.REQUEST_STATE_FINISHED, request_id


def test_the_health_probe_checks_over_mutual_tls(mtls):
    client = tls_files(mtls["certs"], "client")
    for name in ("inference", "anns", "orchestrator"):
        assert check_health("grpc", mtls[name], 10.0, tls=client) is None, name
        assert check_health("grpc", mtls[name], 5.0) is not None, f"{name} answered plaintext"
        assert check_health("grpc", mtls[name], 5.0, tls=TlsFiles(ca=client.ca)) is not None, \
            f"{name} answered a client without a certificate"
    ca = tls_files(mtls["certs"], "client").ca
    assert check_health("http", f"{mtls['gateway'].base_url}/health", 10.0, tls=TlsFiles(ca=ca)) is None
    probe = subprocess.run([sys.executable, "-m", "servicekit.health", "grpc", mtls["orchestrator"], "--timeout", "10",
                            *_tls_flags(mtls["certs"], "client")], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr


@pytest.mark.parametrize("service", ["inference", "anns", "orchestrator"])
def test_a_client_without_a_certificate_is_refused(mtls, service):
    with _channel(mtls, mtls[service], certificate=False) as channel, pytest.raises(grpc.RpcError) as caught:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_retriever_wants_the_key_collections_included(mtls):
    with _channel(mtls, mtls["anns"]) as channel:
        retriever = retriever_pb2_grpc.RetrieverStub(channel)
        collections = retriever_pb2_grpc.CollectionsStub(channel)
        request = retriever_pb2.RetrieveRequest(query=QUESTION, top_k=2)
        for call in (lambda md: list(retriever.Retrieve(request, metadata=md, timeout=30)),
                     lambda md: collections.ListCollections(retriever_pb2.ListCollectionsRequest(), metadata=md,
                                                            timeout=30)):
            with pytest.raises(grpc.RpcError) as caught:
                call(bearer_metadata("wrong"))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert call(bearer_metadata(KEY))
