"""`streamrag certs` and the names clients verify: each certificate names its service's compose,
Kubernetes and loopback names; the Secrets are what deploy/k8s mounts; a server whose certificate
does not name the service dialed is refused, also over a channel of several addresses. Real
mutual-TLS gRPC health servers on loopback."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import subprocess
from pathlib import Path

import grpc
import pytest
import yaml
from cryptography import x509
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from servicekit.channels import open_channel, spread_options, spread_target
from servicekit.tls import ORCHESTRATORS, TlsFiles, authority_options
from streamrag.stack.certs import SERVICES, main
from tests.support.stack import streamrag

ROOT = Path(__file__).resolve().parents[2]
SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    assert main(["--out", str(out), "--namespace", "streamrag", "--k8s-secrets", str(out / "secrets.yaml")]) == 0
    return out


def names_in(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*san.get_values_for_type(x509.DNSName), *map(str, san.get_values_for_type(x509.IPAddress))}


def files(certs: Path, name: str) -> TlsFiles:
    return TlsFiles(certs / f"{name}.crt", certs / f"{name}.key", certs / "ca.crt")


def test_each_certificate_names_its_service_in_kubernetes_and_on_loopback_and_is_signed_by_the_ca(certs: Path):
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    for service in SERVICES:
        x509.load_pem_x509_certificate((certs / f"{service}.crt").read_bytes()).verify_directly_issued_by(ca)
    loopback = {"localhost", "127.0.0.1", str(ipaddress.ip_address("::1"))}
    assert names_in(certs / "anns.crt") == {"anns", "anns.streamrag", "anns.streamrag.svc",
                                            "anns.streamrag.svc.cluster.local", "*.anns.streamrag.svc",
                                            "*.anns.streamrag.svc.cluster.local", *loopback}
    assert {"crawler", "crawler.streamrag.svc.cluster.local"} <= names_in(certs / "crawler.crt")
    assert not any(n.startswith("*") for n in names_in(certs / "crawler.crt"))      # not headless
    assert {"*.inference.streamrag.svc.cluster.local", "inference"} <= names_in(certs / "inference-1.crt")
    for orchestrator in ("orchestrator", "orchestrator-1"):      # the set is dialed as `orchestrators`
        assert {"orchestrator", ORCHESTRATORS, "orchestrators.streamrag.svc.cluster.local"} <= names_in(
            certs / f"{orchestrator}.crt")
    assert names_in(certs / "client.crt") == {"client", *loopback}


def test_the_secrets_are_one_kubernetes_tls_secret_per_service_holding_the_files(certs: Path):
    secrets = list(yaml.safe_load_all((certs / "secrets.yaml").read_text()))
    assert [s["metadata"]["name"] for s in secrets] == [f"{s}-tls" for s in SERVICES if s != "client"]
    for secret in secrets:
        service = secret["metadata"]["name"].removesuffix("-tls")
        assert secret["kind"] == "Secret" and secret["type"] == "kubernetes.io/tls"
        assert secret["metadata"]["namespace"] == "streamrag"
        data = {key: base64.b64decode(value) for key, value in secret["data"].items()}
        assert data == {"tls.crt": (certs / f"{service}.crt").read_bytes(),
                        "tls.key": (certs / f"{service}.key").read_bytes(), "ca.crt": (certs / "ca.crt").read_bytes()}


def test_a_second_run_keeps_the_ca_and_the_script_still_makes_the_compose_set(tmp_path: Path):
    assert main(["--out", str(tmp_path), "--service", "anns"]) == 0
    ca = (tmp_path / "ca.crt").read_bytes()
    subprocess.run(["bash", str(ROOT / "scripts" / "make_certs.sh"), str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    assert (tmp_path / "ca.crt").read_bytes() == ca
    assert all((tmp_path / f"{name}.crt").is_file() and (tmp_path / f"{name}.key").is_file() for name in SERVICES)


def test_a_bad_namespace_gets_one_line(tmp_path: Path):
    run = streamrag("certs", "--out", str(tmp_path), "--namespace", "Not_A_Label", timeout=120)
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0, run.stderr
    assert "--namespace 'Not_A_Label' is not a DNS label" in run.stderr


def test_an_address_is_verified_against_the_service_name_and_a_name_against_itself():
    expected = (("grpc.ssl_target_name_override", ORCHESTRATORS), ("grpc.default_authority", ORCHESTRATORS))
    assert authority_options("ipv4:127.0.0.1:1,127.0.0.1:2", ORCHESTRATORS) == expected
    assert authority_options("10.0.0.7:50052", ORCHESTRATORS) == expected
    assert authority_options("[::1]:50052", ORCHESTRATORS) == expected
    assert authority_options("dns:///orchestrator.streamrag.svc:50051", ORCHESTRATORS) == ()
    assert authority_options("inference-0:50052", "inference") == ()


async def serve_health(cert: TlsFiles) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", cert.server_credentials())
    await server.start()
    return server, port


async def check(channel: grpc.aio.Channel) -> str:
    try:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_a_certificate_that_does_not_name_the_service_dialed_is_refused(certs: Path):
    """The crawler's certificate names 127.0.0.1 but not `anns`: dialed as anns, its handshake fails."""
    async def run() -> list[str]:
        client = files(certs, "client")
        results = []
        for presented in ("anns", "crawler"):
            server, port = await serve_health(files(certs, presented))
            channel = open_channel(f"127.0.0.1:{port}", client, server_name="anns")
            results.append(await check(channel))
            await channel.close()
            await server.stop(None)
        return results

    assert asyncio.run(run()) == ["SERVING", "UNAVAILABLE"]


def test_an_authority_the_caller_gives_is_the_name_checked(certs: Path):
    """A replica found by DNS is dialed by address with the name as its authority (orchestrator.discovery):
    that name is checked, not the service's default name."""
    async def run() -> list[str]:
        server, port = await serve_health(files(certs, "crawler"))
        results = []
        for authority in ("crawler", "anns"):
            channel = open_channel(f"127.0.0.1:{port}", files(certs, "client"),
                                   options=(("grpc.default_authority", f"{authority}:{port}"),), server_name="anns")
            results.append(await check(channel))
            await channel.close()
        await server.stop(None)
        return results

    assert asyncio.run(run()) == ["SERVING", "UNAVAILABLE"]


def test_a_channel_over_several_addresses_verifies_each_against_the_service_name(certs: Path):
    """First address: a server whose certificate names that address (127.0.0.1) but not the
    orchestrators. It is refused, so every call goes to the second server, an orchestrator; with that
    one stopped, no call succeeds."""
    async def run() -> list[str]:
        impostor, impostor_port = await serve_health(files(certs, "crawler"))
        orchestrator, port = await serve_health(files(certs, "orchestrator-1"))
        target = spread_target([f"127.0.0.1:{impostor_port}", f"127.0.0.1:{port}"])
        channel = open_channel(target, files(certs, "client"), options=spread_options(wait_for_ready=False),
                               server_name=ORCHESTRATORS)
        results = [await check(channel) for _ in range(4)]
        await orchestrator.stop(None)
        await asyncio.sleep(0.5)
        results.append(await check(channel))
        await channel.close()
        await impostor.stop(None)
        return results

    assert asyncio.run(run()) == ["SERVING"] * 4 + ["UNAVAILABLE"]
