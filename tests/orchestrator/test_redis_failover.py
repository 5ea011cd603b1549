"""The orchestrator's Redis state over a Sentinel set (real redis-server primary, replica and three
Sentinels): the lifecycle store and the session directory keep working when the primary is killed
and a replica promoted, terminal records acknowledged by a replica survive the primary's loss, and
an orchestrator process started on the Sentinel URL reads them back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from prometheus_client import generate_latest

from orchestrator.lifecycle_store import LifecycleStore, request_key
from orchestrator.metrics import OrchestratorMetrics
from orchestrator.session_directory import SessionDirectory
from protos import orchestrator_pb2, orchestrator_pb2_grpc
from servicekit.health import check_health
from servicekit.redis_url import RedisUrlError, check_reachable
from tests.support.orchestrator import OrchestratorProcess
from tests.support.redis_sentinel import SentinelSet
from tests.support.redis_server import free_port


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    with SentinelSet(tmp_path) as redis_set:
        yield redis_set


async def answer(store: LifecycleStore, request_id: str) -> None:
    await store.create(request_id, f"question {request_id}", retriever="none", streamed=True)
    await store.event(request_id, "FIRST_TOKEN")
    await store.update(request_id, state="FINISHED", answer=f"answer {request_id}")


def stored_answer(port: int, request_id: str) -> str | None:
    client = redis.Redis(port=port, decode_responses=True, socket_timeout=5)
    try:
        return client.hget(request_key(request_id), "answer")
    finally:
        client.close()


def served_record(url: str, request_id: str) -> tuple[str, str]:
    """`GetRequest` from an orchestrator process started with `--redis url`."""
    process = OrchestratorProcess(url, [f"127.0.0.1:{free_port()}"])
    try:
        with grpc.insecure_channel(process.address) as channel:
            record = orchestrator_pb2_grpc.OrchestratorStub(channel).GetRequest(
                orchestrator_pb2.GetRequestRequest(request_id=request_id), timeout=60).record
    finally:
        process.stop()
    return orchestrator_pb2.RequestState.Name(record.state).removeprefix("REQUEST_STATE_"), record.answer


async def test_the_store_and_sessions_follow_a_failover_and_keep_every_acknowledged_terminal_record(
        sentinel_set: SentinelSet):
    assert check_health("redis", sentinel_set.url) is None        # the health check finds the primary
    assert check_reachable(sentinel_set.url).replicated
    with pytest.raises(RedisUrlError, match="know no master named 'other'"):
        check_reachable(sentinel_set.url.replace("/streamrag/", "/other/"))
    store = LifecycleStore(sentinel_set.url, ttl_s=600, retry_s=0.05, retry_max_s=0.5)
    directory = SessionDirectory(sentinel_set.url, ttl_s=600)
    await store.start()
    try:
        assert store.wait_replicas == 1
        before = [f"before-{i}" for i in range(20)]
        for request_id in before:
            await answer(store, request_id)
        assert await store.flush(30)
        assert store.unreplicated == 0           # each terminal batch was acknowledged by the replica
        assert await directory.create("s1", "127.0.0.1:1", "be brief", 100)
        replica_port = next(s.port for s in sentinel_set.servers if s.port != sentinel_set.primary_port())
        assert all(stored_answer(replica_port, r) == f"answer {r}" for r in before)

        killed = await asyncio.to_thread(sentinel_set.kill_primary)
        assert sentinel_set.primary_port() == replica_port

        after = [f"after-{i}" for i in range(20)]
        for request_id in after:
            await answer(store, request_id)
        assert await store.flush(60)
        await directory.set_replica("s1", "127.0.0.1:2")           # retried until the new primary answers
        assert (await directory.get("s1")).replica == "127.0.0.1:2"
        for request_id in before + after:
            stored = await store.get(request_id)
            assert stored is not None and stored.state == "FINISHED" and stored.answer == f"answer {request_id}"
        assert store.write_errors == 0 and store.dropped == 0
        # The new primary has no replica yet: its terminal writes are counted, the answers go on.
        assert store.unreplicated >= 1
        unreplicated = store.unreplicated

        await asyncio.to_thread(sentinel_set.restart, killed)     # back, as the new primary's replica
        await answer(store, "last")
        assert await store.flush(30)
        assert store.unreplicated == unreplicated
        assert stored_answer(killed.port, "last") == "answer last"
        metrics = OrchestratorMetrics()           # what the orchestrator's /metrics shows of it
        metrics.watch_store(store)
        assert (f"streamrag_lifecycle_unreplicated_writes_total {float(unreplicated)}"
                in generate_latest(metrics.registry).decode())
        assert check_health("redis", sentinel_set.url) is None
        assert await asyncio.to_thread(served_record, sentinel_set.url, "before-3") == ("FINISHED", "answer before-3")
    finally:
        await store.close(timeout_s=5)
        await directory.close()
