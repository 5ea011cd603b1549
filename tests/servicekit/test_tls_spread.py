"""One TLS channel over several servers (`spread_target`'s `ipv4:a,b`, as `streamrag ask`, the gateway and
`bench chaos` dial every orchestrator of a stack with mutual TLS) verifies each server: gRPC's own
authority for such a target is the whole address list, which no certificate names ("Hostname
Verification Check failed" on every handshake), so `servicekit.tls.authority_options` gives it the
first address. Real mutual-TLS health servers on loopback with scripts/make_certs.sh's certificates."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from servicekit.auth import keyed_channel
from servicekit.channels import open_channel, spread_options, spread_target
from servicekit.tls import authority_options
from tests.support.gateway import make_certs, tls_files


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_only_a_target_of_several_addresses_gets_an_authority():
    assert authority_options("ipv4:127.0.0.1:50051,127.0.0.1:50071") == (("grpc.default_authority",
                                                                          "127.0.0.1:50051"),)
    assert authority_options("ipv6:[::1]:50051,[::1]:50071") == (("grpc.default_authority", "[::1]:50051"),)
    assert authority_options("127.0.0.1:50051") == ()
    assert authority_options("dns:///orchestrators:50051") == ()


def sync_check(target: str, client) -> int:
    with keyed_channel(target, spread_options(wait_for_ready=False), key="sk-test", tls=client) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10,
                                                         wait_for_ready=True).status


def test_one_mutual_tls_channel_over_two_servers_reaches_each(certs: Path):
    async def run() -> list[int]:
        servers, ports = [], []
        for name in ("orchestrator", "orchestrator-1"):
            server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
            ports.append(server.add_secure_port("127.0.0.1:0", tls_files(certs, name).server_credentials()))
            await server.start()
            servers.append(server)
        target = spread_target([f"127.0.0.1:{port}" for port in ports])
        client = tls_files(certs, "client")
        statuses = []
        try:
            channel = open_channel(target, client, options=spread_options(wait_for_ready=False))
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(4):
                statuses.append((await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)).status)
            await servers[0].stop(None)           # the second server alone: its own certificate is verified
            await asyncio.sleep(0.5)
            statuses.append((await stub.Check(health_pb2.HealthCheckRequest(), timeout=10,
                                              wait_for_ready=True)).status)
            await channel.close()
            statuses.append(await asyncio.to_thread(sync_check, target, client))   # the servers run on this loop
        finally:
            for server in servers:
                await server.stop(None)
        return statuses

    assert asyncio.run(run()) == [health_pb2.HealthCheckResponse.SERVING] * 6
