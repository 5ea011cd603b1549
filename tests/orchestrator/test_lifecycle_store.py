"""LifecycleStore against a real redis-server: records, TTLs, the recent index, and outages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis.asyncio as redis

from orchestrator.lifecycle_store import (
    RECENT_KEY,
    LifecycleStore,
    StoreUnavailable,
    events_key,
    request_key,
    to_proto,
)
from protos import common_pb2, orchestrator_pb2
from tests.support.redis_server import PrivateRedis

T = TypeVar("T")
BOUND_S = 5.0  # generous: a call that "does not block" must finish well inside this


async def bounded(call: Awaitable[T]) -> T:
    """The call's result; fails the test if it takes longer than BOUND_S."""
    return await asyncio.wait_for(call, BOUND_S)


@pytest.fixture
async def store(redis_server: PrivateRedis) -> AsyncIterator[LifecycleStore]:
    s = LifecycleStore(redis_server.url, ttl_s=120, retry_s=0.02, retry_max_s=0.1)
    await s.start()
    yield s
    await s.close(timeout_s=1)


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[PrivateRedis]:
    # Persistent, so a restart keeps what was written before the outage; DEBUG SLEEP for timeouts.
    server = PrivateRedis(tmp_path, persist=True, extra_args=("--enable-debug-command", "local"))
    yield server
    server.stop()


@pytest.fixture
async def raw(redis_server: PrivateRedis) -> AsyncIterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


def kinds(stored) -> list[str]:
    return [e.kind for e in stored.events]


async def test_round_trip_keeps_fields_and_events_in_order(store: LifecycleStore) -> None:
    await store.create("r1", "why is the sky blue?", retriever="anns", streamed=True, replica="127.0.0.1:7001")
    for seq in range(3):
        await store.event("r1", "RETRIEVAL_CHUNK", source="anns", seq=seq, final=seq == 2)
    await store.event("r1", common_pb2.LIFECYCLE_EVENT_KIND_QUEUED, count=0)
    await store.event("r1", "SCHEDULED")
    await store.event("r1", "FIRST_TOKEN", unix_ms=1_700_000_000_123)
    await store.update("r1", state="GENERATING")
    await store.event("r1", "FINISHED", detail="stop")
    stats = common_pb2.RequestStats(prompt_tokens=321, tokens_computed=400, ttft_from_open_s=0.25)
    await store.update("r1", state=orchestrator_pb2.REQUEST_STATE_FINISHED, answer="Rayleigh scattering.",
                       ttft_from_question_s=0.5, ttft_from_retrieval_end_s=-0.1, stats=stats,
                       finish_reason="STOP", error=None)
    assert await store.flush(BOUND_S)

    got = await store.get("r1")
    assert got is not None
    assert (got.question, got.state, got.replica, got.retriever, got.streamed) == (
        "why is the sky blue?", "FINISHED", "127.0.0.1:7001", "anns", True)
    assert (got.answer, got.ttft_from_question_s, got.ttft_from_retrieval_end_s) == ("Rayleigh scattering.", 0.5, -0.1)
    assert got.stats["prompt_tokens"] == 321 and got.stats["ttft_from_open_s"] == 0.25
    assert got.extra == {"finish_reason": "STOP"}
    assert got.error == ""
    assert kinds(got) == ["RETRIEVAL_CHUNK"] * 3 + ["QUEUED", "SCHEDULED", "FIRST_TOKEN", "FINISHED"]
    assert [e.fields for e in got.events[:3]] == [
        {"source": "anns", "seq": "0", "final": "0"}, {"source": "anns", "seq": "1", "final": "0"},
        {"source": "anns", "seq": "2", "final": "1"}]
    assert got.events[3].fields == {"count": "0"}
    assert got.events[5].unix_ms == 1_700_000_000_123
    ids = [tuple(map(int, e.stream_id.split("-"))) for e in got.events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert got.created_unix_ms <= got.updated_unix_ms
    assert got.updated_unix_ms >= got.events[-1].unix_ms


async def test_get_unknown_request_is_none(store: LifecycleStore) -> None:
    assert await store.get("nobody") is None


async def test_get_includes_writes_still_queued(store: LifecycleStore) -> None:
    await store.create("r1", "q", retriever="none", streamed=False)
    await store.event("r1", "QUEUED")
    got = await store.get("r1")  # nothing awaited in between: the writer has not run yet
    assert got is not None and got.question == "q" and kinds(got) == ["QUEUED"]
    assert await store.flush(BOUND_S)
    again = await store.get("r1")
    assert again is not None and [e.stream_id for e in again.events] == [e.stream_id for e in got.events]


async def test_hash_stream_and_index_expire_and_writes_refresh_ttl(store: LifecycleStore, raw: redis.Redis) -> None:
    await store.create("r1", "q", retriever="anns", streamed=True)
    await store.event("r1", "QUEUED")
    assert await store.flush(BOUND_S)
    for key in (request_key("r1"), events_key("r1"), RECENT_KEY):
        assert 0 < await raw.ttl(key) <= 120
    await raw.expire(request_key("r1"), 5)
    await raw.expire(events_key("r1"), 5)
    await store.update("r1", state="RETRIEVING")
    assert await store.flush(BOUND_S)
    assert await raw.ttl(request_key("r1")) > 100
    assert await raw.ttl(events_key("r1")) > 100


async def test_recent_lists_newest_first_and_is_trimmed(redis_server: PrivateRedis, raw: redis.Redis) -> None:
    async with LifecycleStore(redis_server.url, recent_max=3) as store:
        for n in range(5):
            await store.create(f"r{n}", f"question {n}", retriever="crawler", streamed=True)
            await asyncio.sleep(0.003)  # distinct created_unix_ms
        assert await store.flush(BOUND_S)
        rows = await store.recent(10)
        assert [r.request_id for r in rows] == ["r4", "r3", "r2"]
        assert rows[0].question == "question 4" and rows[0].state == "RECEIVED" and rows[0].events == []
        assert [r.request_id for r in await store.recent(2)] == ["r4", "r3"]
        assert await raw.zcard(RECENT_KEY) == 3
        await raw.delete(request_key("r3"))  # expired: left out of the list
        assert [r.request_id for r in await store.recent(10)] == ["r4", "r2"]


async def test_to_proto_builds_the_request_record(store: LifecycleStore) -> None:
    await store.create("r1", "q?", retriever="anns,crawler", streamed=False, replica="a:1")
    await store.event("r1", "INVALIDATED", count=12, detail="update")
    await store.update("r1", state="FAILED", error="replica died", ttft_from_question_s=1.5,
                       stats={"prompt_tokens": 10, "time_queued_s": 0.125})
    assert await store.flush(BOUND_S)
    stored = await store.get("r1")
    assert stored is not None
    record = to_proto(stored)
    assert isinstance(record, orchestrator_pb2.RequestRecord)
    assert record.request_id == "r1" and record.question == "q?" and record.replica == "a:1"
    assert record.state == orchestrator_pb2.REQUEST_STATE_FAILED and record.error == "replica died"
    assert record.retriever == orchestrator_pb2.RETRIEVER_CHOICE_BOTH and not record.streamed
    assert record.ttft_from_question_s == 1.5
    assert record.stats.prompt_tokens == 10 and record.stats.time_queued_s == 0.125
    assert record.created_unix_ms == stored.created_unix_ms and record.updated_unix_ms == stored.updated_unix_ms
    [event] = record.events
    assert event.kind == "INVALIDATED" and dict(event.fields) == {"count": "12", "detail": "update"}
    assert event.stream_id == stored.events[0].stream_id and event.unix_ms == stored.events[0].unix_ms
    for name, choice in [("anns", "ANNS"), ("none", "NONE"), ("replay", "REPLAY"), ("", "UNSPECIFIED")]:
        stored.retriever = name
        assert to_proto(stored).retriever == orchestrator_pb2.RetrieverChoice.Value(f"RETRIEVER_CHOICE_{choice}")


async def test_outage_buffers_writes_and_flushes_them_in_order_with_a_gap_event(restartable: PrivateRedis) -> None:
    store = LifecycleStore(restartable.url, retry_s=0.02, retry_max_s=0.1, timeout_s=1.0)
    await store.start()
    try:
        await store.create("r1", "q", retriever="anns", streamed=True)
        await store.event("r1", "QUEUED")
        await store.event("r1", "SCHEDULED")
        assert await store.flush(BOUND_S)

        restartable.stop()
        before = int(time.time() * 1000)
        for kind in ("KV_ON_GPU", "PREEMPTED_SWAP", "FIRST_TOKEN"):
            await bounded(store.event("r1", kind))
        await bounded(store.create("r2", "asked while down", retriever="anns", streamed=False))
        await bounded(store.event("r2", "QUEUED"))
        await asyncio.sleep(0.3)  # the writer tries, fails and backs off meanwhile
        assert not store.available and store.pending >= 5
        await bounded(store.event("r1", "FINISHED"))
        await bounded(store.update("r1", state="FINISHED", answer="done anyway"))
        assert not await store.flush(0.2)  # still down

        restartable.restart()
        assert await store.flush(BOUND_S)
        after = int(time.time() * 1000)
        await store.event("r1", "AFTER_RESUME")
        assert await store.flush(BOUND_S)

        got = await store.get("r1")
        assert got is not None and got.state == "FINISHED" and got.answer == "done anyway"
        assert kinds(got) == ["QUEUED", "SCHEDULED", "KV_ON_GPU", "PREEMPTED_SWAP", "FIRST_TOKEN", "FINISHED",
                              "REDIS_GAP", "AFTER_RESUME"]
        gap = got.events[6].fields
        assert gap["dropped"] == "0"
        assert before - 1000 <= int(gap["since_unix_ms"]) <= int(gap["until_unix_ms"]) <= after
        other = await store.get("r2")
        assert other is not None and other.question == "asked while down"
        assert kinds(other) == ["QUEUED", "REDIS_GAP"]
        assert store.available and store.dropped == 0 and store.pending == 0
    finally:
        await store.close(timeout_s=1)


async def test_full_buffer_drops_the_oldest_writes_and_counts_them(restartable: PrivateRedis) -> None:
    store = LifecycleStore(restartable.url, buffer_max=5, retry_s=0.02, retry_max_s=0.1, timeout_s=1.0)
    await store.start()
    try:
        restartable.stop()
        await bounded(store.create("r1", "q", retriever="anns", streamed=True))
        for n in range(8):
            await bounded(store.event("r1", "RETRIEVAL_CHUNK", seq=n))
            await asyncio.sleep(0.01)  # let the writer try (and fail) in between
        await asyncio.sleep(0.2)
        assert store.dropped == 4  # 9 writes, room for 5: the create and chunks 0-2 are gone
        assert store.pending == 5

        restartable.restart()
        assert await store.flush(BOUND_S)
        got = await store.get("r1")
        assert got is not None
        assert got.question == ""  # the create was dropped
        assert kinds(got) == ["RETRIEVAL_CHUNK"] * 5 + ["REDIS_GAP"]
        assert [e.fields["seq"] for e in got.events[:5]] == ["3", "4", "5", "6", "7"]
        assert got.events[-1].fields["dropped"] == "4"
    finally:
        await store.close(timeout_s=1)


async def test_batch_resent_after_a_timeout_is_not_stored_twice(restartable: PrivateRedis) -> None:
    store = LifecycleStore(restartable.url, timeout_s=0.2, retry_s=0.02, retry_max_s=0.1)
    blocker = redis.Redis.from_url(restartable.url, decode_responses=True)
    await store.start()
    try:
        await store.create("r1", "q", retriever="anns", streamed=True)
        assert await store.flush(BOUND_S)
        await blocker.ping()  # connected, so DEBUG SLEEP goes out at once
        sleeping = asyncio.create_task(blocker.execute_command("DEBUG", "SLEEP", "1.0"))
        await asyncio.sleep(0.1)  # Redis is busy: the batch arrives, the writer times out and re-sends
        for n in range(20):
            await store.event("r1", "RETRIEVAL_CHUNK", seq=n)
        await sleeping
        assert await store.flush(BOUND_S)
        got = await store.get("r1")
        assert got is not None
        assert kinds(got) == ["RETRIEVAL_CHUNK"] * 20 + ["REDIS_GAP"]  # the gap shows the writer did fail
        assert [e.fields["seq"] for e in got.events[:20]] == [str(n) for n in range(20)]
        assert store.write_errors == 0
    finally:
        await blocker.aclose()
        await store.close(timeout_s=1)


async def test_reads_while_redis_is_down_raise_store_unavailable(redis_server: PrivateRedis) -> None:
    store = LifecycleStore(redis_server.url, retry_s=0.02, timeout_s=1.0)
    await store.start()
    try:
        await store.create("r1", "q", retriever="anns", streamed=True)
        assert await store.flush(BOUND_S)
        redis_server.stop()
        with pytest.raises(StoreUnavailable):
            await bounded(store.get("r1"))
        with pytest.raises(StoreUnavailable):
            await bounded(store.recent(10))
    finally:
        assert await bounded(store.close(timeout_s=0.2)) == 0


async def test_close_flushes_queued_writes(redis_server: PrivateRedis, raw: redis.Redis) -> None:
    store = LifecycleStore(redis_server.url)
    await store.start()
    await store.create("r1", "q", retriever="anns", streamed=True)
    for n in range(50):
        await store.event("r1", "RETRIEVAL_CHUNK", seq=n)
    assert await store.close() == 0
    assert await raw.xlen(events_key("r1")) == 50
    assert await raw.hget(request_key("r1"), "question") == "q"


async def test_close_while_redis_is_down_returns_within_its_timeout(redis_server: PrivateRedis) -> None:
    store = LifecycleStore(redis_server.url, retry_s=0.02, timeout_s=1.0)
    await store.start()
    redis_server.stop()
    await store.create("r1", "q", retriever="anns", streamed=True)
    await store.event("r1", "QUEUED")
    assert await bounded(store.close(timeout_s=0.3)) == 2


async def test_confirm_returns_once_earlier_writes_are_stored_however_busy_the_queue(
        store: LifecycleStore, raw: redis.Redis) -> None:
    stop = asyncio.Event()

    async def busy() -> None:   # other requests' writes keep arriving: the queue is never idle for long
        n = 0
        while not stop.is_set():
            await store.event("other", "RETRIEVAL_CHUNK", seq=n)
            n += 1
            await asyncio.sleep(0)

    writer = asyncio.create_task(busy())
    try:
        await asyncio.sleep(0.05)
        await store.create("r1", "q", retriever="anns", streamed=True)
        await store.update("r1", state="FINISHED", answer="a")
        assert await bounded(store.confirm(BOUND_S))
        assert await raw.hget(request_key("r1"), "state") == "FINISHED"   # stored, not only queued
    finally:
        stop.set()
        await writer


async def test_confirm_with_redis_down_gives_up_at_its_timeout(redis_server: PrivateRedis) -> None:
    store = LifecycleStore(redis_server.url, retry_s=0.02, timeout_s=1.0)
    await store.start()
    redis_server.stop()
    await store.create("r1", "q", retriever="anns", streamed=True)
    assert await bounded(store.confirm(0.3)) is False
    assert store.pending == 1   # still queued for when Redis is back
    await store.close(timeout_s=0.1)


async def test_a_finished_answer_is_stored_before_record_finished_returns(
        store: LifecycleStore, raw: redis.Redis) -> None:
    from orchestrator.recording import record_finished
    from protos import inference_pb2

    await store.create("r2", "q", retriever="anns", streamed=True)
    done = inference_pb2.InferenceDone(text="the answer")
    await bounded(record_finished(store, "r2", done, ttft_from_question_s=0.1, total_s=0.2))
    # what an orchestrator SIGKILLed right after sending the last message leaves in Redis
    assert await raw.hget(request_key("r2"), "state") == "FINISHED"
    assert await raw.hget(request_key("r2"), "answer") == "the answer"
