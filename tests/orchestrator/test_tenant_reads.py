"""A tenant reads only its own request records (orchestrator/servicer.py, tenancy.py's `reader_scope`),
over a real orchestrator process and a real Redis: another tenant's request is NOT_FOUND like one that does
not exist, a list holds the caller's tenant's alone (`streamrag requests` too), and an admin tenant and the
operator (the stack's own key, naming no tenant) read every tenant's."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from orchestrator.lifecycle_store import LifecycleStore
from orchestrator.recording import record_tenant
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from protos.metadata import identity_metadata
from servicekit.auth import bearer_metadata
from streamrag import cli
from tests.support.orchestrator import OrchestratorProcess
from tests.support.redis_server import PrivateRedis, free_port

STACK_KEY = "sk-reads-stack-own"
TENANTS = """
[tenants.acme]
keys = ["sk-acme"]

[tenants.lab]
keys = ["sk-lab"]

[tenants.ops]
keys = ["sk-ops"]
admin = true
"""
RECORDS = {"acme-1": "acme", "acme-2": "acme", "lab-1": "lab", "old-1": ""}   # old-1: before tenants


async def record(redis_url: str) -> None:
    async with LifecycleStore(redis_url) as store:
        for request_id, tenant in RECORDS.items():
            await store.create(request_id, f"{request_id}?", retriever="anns", streamed=True)
            if tenant:
                await record_tenant(store, request_id, tenant, 0)
            await asyncio.sleep(0.005)          # distinct creation times
        assert await store.flush(10)


@pytest.fixture(scope="module")
def orchestrator(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenant-reads")
    redis = PrivateRedis(tmp)
    (tmp / "tenants.toml").write_text(TENANTS)
    process = None
    try:
        asyncio.run(record(redis.url))
        process = OrchestratorProcess(redis.url, [f"127.0.0.1:{free_port()}"], log_path=tmp / "orchestrator.log",
                                      args=("--tenants", str(tmp / "tenants.toml")),
                                      env={"STREAMRAG_API_KEY": STACK_KEY})
        yield process
    finally:
        if process is not None:
            process.stop()
        redis.stop()


def stub(process: OrchestratorProcess):
    return orchestrator_pb2_grpc.OrchestratorStub(grpc.insecure_channel(process.address))


def listed(process, key: str, tenant: str = "", names: str = "") -> list[str]:
    """The ids ListRequests gives the caller with `key` (`tenant`: the request's filter; `names`: the
    tenant the call names, as the gateway does)."""
    metadata = (*bearer_metadata(key), *identity_metadata(names))
    records = stub(process).ListRequests(orchestrator_pb2.ListRequestsRequest(limit=50, tenant=tenant), timeout=30,
                                         metadata=metadata).records
    return sorted(r.request_id for r in records)


def get(process, key: str, request_id: str, names: str = "") -> grpc.RpcError | orchestrator_pb2.RequestRecord:
    try:
        return stub(process).GetRequest(orchestrator_pb2.GetRequestRequest(request_id=request_id), timeout=30,
                                        metadata=(*bearer_metadata(key), *identity_metadata(names))).record
    except grpc.RpcError as exc:
        return exc


def test_a_tenant_reads_its_own_records_only_and_another_tenants_id_is_not_found_like_none(orchestrator):
    assert listed(orchestrator, "sk-acme") == ["acme-1", "acme-2"]
    assert listed(orchestrator, "sk-lab") == ["lab-1"]
    assert listed(orchestrator, "sk-acme", tenant="lab") == []            # asking for another's: none
    assert listed(orchestrator, "sk-acme", tenant="acme") == ["acme-1", "acme-2"]
    assert get(orchestrator, "sk-acme", "acme-1").tenant == "acme"
    hidden, missing = get(orchestrator, "sk-acme", "lab-1"), get(orchestrator, "sk-acme", "no-such-id")
    assert hidden.code() == missing.code() == grpc.StatusCode.NOT_FOUND
    assert hidden.details() == "no request 'lab-1'" and missing.details() == "no request 'no-such-id'"
    assert get(orchestrator, "sk-acme", "old-1").code() == grpc.StatusCode.NOT_FOUND
    assert get(orchestrator, "sk-acme", "lab-1", names="lab").code() == grpc.StatusCode.NOT_FOUND  # a tenant's
    # key is its tenant's, whatever it names


def test_the_stack_key_naming_a_tenant_reads_as_that_tenant(orchestrator):
    assert listed(orchestrator, STACK_KEY, names="lab") == ["lab-1"]       # as the gateway calls for a caller
    assert get(orchestrator, STACK_KEY, "acme-1", names="lab").code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("key", ["sk-ops", STACK_KEY], ids=["admin-tenant", "operator"])
def test_an_admin_tenant_and_the_operator_read_every_tenants_records(orchestrator, key):
    assert listed(orchestrator, key) == sorted(RECORDS)
    assert listed(orchestrator, key, tenant="lab") == ["lab-1"]
    assert get(orchestrator, key, "lab-1").tenant == "lab"
    assert get(orchestrator, key, "old-1").request_id == "old-1"


def test_streamrag_requests_with_a_tenants_key_lists_that_tenants_requests(orchestrator, monkeypatch, capsys):
    monkeypatch.setenv("STREAMRAG_API_KEY", "sk-lab")
    assert cli.main(["requests", "--orchestrator", orchestrator.address]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["lab-1"]
    assert cli.main(["requests", "--orchestrator", orchestrator.address, "acme-1"]) == 1
    assert "error: NOT_FOUND: no request 'acme-1'" in capsys.readouterr().err
