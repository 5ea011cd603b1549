"""The replica router: FlowGuard scoring on injected stats, then two real Inference replicas."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable

import grpc
import pytest

from orchestrator.router import NoReplicaAvailable, ReplicaRouter
from protos import common_pb2, inference_pb2, inference_pb2_grpc
from tests.support.inference import RunningInference
from tests.support.inference_calls import open_msg, seg

A, B, C = "replica-a:1", "replica-b:1", "replica-c:1"
KEY = "You answer questions about Python using the documents below."


def stats(*, free: int = 100, total: int = 100, waiting: int = 0, swapped: int = 0, running: int = 0,
          active: int = 0, max_streams: int = 10, received: int = 0) -> inference_pb2.EngineStats:
    return inference_pb2.EngineStats(
        pools=[inference_pb2.BlockPoolStats(name="device", total_blocks=total, free_blocks=free),
               inference_pb2.BlockPoolStats(name="cpu", total_blocks=100, free_blocks=100)],
        num_waiting=waiting, num_swapped=swapped, num_running=running, num_active=active,
        max_concurrent_streams=max_streams, counters=inference_pb2.EngineCounters(requests_received=received))


def router_with(snapshots: dict[str, inference_pb2.EngineStats], **options) -> ReplicaRouter:
    router = ReplicaRouter(list(snapshots), **options)
    for address, snapshot in snapshots.items():
        router.record_stats(address, snapshot)
        router.record_health(address, None)      # what the replica's health Watch says: SERVING
    return router


# --- scoring --------------------------------------------------------------------------------
def test_score_follows_the_documented_formula():
    router = router_with({A: stats(free=60, waiting=1, swapped=1, active=5), B: stats(waiting=4, active=1)})
    router.note_served(A, KEY)
    s = router.scores(KEY)
    assert (s[A].locality, s[A].memory_use, s[A].queue, s[A].load) == pytest.approx((1, 0.4, 0.5, 0.5))
    assert s[A].score == pytest.approx(0.4 * 1 + 0.1 * 0.6 + 0.3 * 0.5 + 0.2 * 0.5)
    assert (s[B].locality, s[B].memory_use, s[B].queue, s[B].load) == pytest.approx((0, 0, 1, 0.1))
    assert s[B].score == pytest.approx(0.1 * 1 + 0.3 * 0 + 0.2 * 0.9)


def test_locality_wins_when_load_is_equal():
    router = router_with({A: stats(active=2), B: stats(active=2)})
    router.note_served(B, KEY)
    assert router.choose(KEY).address == B
    assert router.choose("another preamble").address == A   # no locality anywhere: ties go to order


def test_memory_starved_replica_loses():
    router = router_with({A: stats(free=5), B: stats(free=50)})
    assert router.choose(KEY).address == B


def test_queue_heavy_replica_loses():
    router = router_with({A: stats(waiting=6, running=4), B: stats(waiting=1, running=4)})
    assert router.choose(KEY).address == B


def test_busier_replica_loses():
    router = router_with({A: stats(active=7), B: stats(active=3)})
    assert router.choose(KEY).address == B


def test_locality_outweighs_a_moderately_busier_replica():
    router = router_with({A: stats(active=6, free=40), B: stats(active=1)})
    router.note_served(A, KEY)
    assert router.choose(KEY).address == A


@pytest.mark.parametrize("busy", [stats(free=5), stats(active=10)], ids=["memory", "streams"])
def test_overloaded_replica_is_skipped_even_with_locality(busy):
    router = router_with({A: busy, B: stats(waiting=3, active=8)})
    router.note_served(A, KEY)
    assert router.scores(KEY)[A].overloaded
    assert router.choose(KEY).address == B


def test_all_overloaded_the_shortest_queue_wins():
    router = router_with({A: stats(free=2, waiting=5), B: stats(active=10, waiting=1), C: stats(free=1, waiting=3)})
    router.note_served(C, KEY)
    assert router.choose(KEY).address == B


def test_all_overloaded_equal_queues_fewest_active_wins():
    router = router_with({A: stats(free=2, waiting=2, active=9), B: stats(free=1, waiting=2, active=4)})
    assert router.choose(KEY).address == B


def test_overload_threshold_is_configurable():
    snapshots = {A: stats(free=15), B: stats(free=50, waiting=2, active=5)}
    router = router_with(snapshots)
    router.note_served(A, KEY)
    assert router.choose(KEY).address == A                     # 85% used is under 0.9
    strict = router_with(snapshots, overload_threshold=0.8)
    strict.note_served(A, KEY)
    assert strict.choose(KEY).address == B


def test_exclude_skips_a_replica():
    router = router_with({A: stats(), B: stats(active=5), C: stats(active=9)})
    router.note_served(A, KEY)
    assert router.choose(KEY, exclude={A}).address == B
    assert router.choose(KEY, exclude={A, B}).address == C      # even when it is overloaded
    with pytest.raises(NoReplicaAvailable, match="excluded"):
        router.choose(KEY, exclude={A, B, C})


def test_replicas_are_skipped_until_their_health_says_serving():
    router = ReplicaRouter([A, B])
    router.record_stats(A, stats(active=9))
    router.record_stats(B, stats())
    with pytest.raises(NoReplicaAvailable, match="no health answer yet"):
        router.choose(KEY)                                       # stats alone do not make a replica available
    router.record_health(A, None)
    router.record_health(B, None)
    router.note_served(A, KEY)
    router.mark_failed(B, "connection refused")
    assert set(router.scores(KEY)) == {A}
    assert router.choose(KEY).address == A
    router.record_health(A, "health NOT_SERVING")
    with pytest.raises(NoReplicaAvailable, match="connection refused"):
        router.choose(KEY)
    router.record_stats(B, stats())                              # a GetStats answer is not health
    with pytest.raises(NoReplicaAvailable):
        router.choose(KEY)
    router.record_health(B, None)                                # its Watch says SERVING again
    assert router.choose(KEY).address == B


async def test_choose_ready_waits_for_a_replica_to_come_back():
    router = router_with({A: stats(), B: stats()})
    router.mark_failed(A, "killed")
    router.mark_failed(B, "killed")
    with pytest.raises(NoReplicaAvailable, match="killed"):
        await router.choose_ready(KEY, wait_s=0.05)              # none comes back within the wait
    asyncio.get_running_loop().call_later(0.1, router.record_health, B, None)
    assert (await router.choose_ready(KEY, wait_s=60)).address == B
    asyncio.get_running_loop().call_later(0.1, router.record_health, A, None)
    assert (await router.choose_ready(KEY, exclude={B}, wait_s=60)).address == A


def test_weights_are_configurable():
    snapshots = {A: stats(active=8), B: stats(active=1)}
    default = router_with(snapshots)
    default.note_served(A, KEY)
    assert default.choose(KEY).address == A
    load_only = router_with(snapshots, weights=(0, 0, 0, 1))
    load_only.note_served(A, KEY)
    assert load_only.scores(KEY)[B].score == pytest.approx(0.9)
    assert load_only.choose(KEY).address == B
    scaled = router_with(snapshots, weights=(4, 1, 3, 2))        # normalised to sum 1
    assert scaled.weights == pytest.approx((0.4, 0.1, 0.3, 0.2))


def test_requests_between_refreshes_spread_instead_of_piling_up():
    router = router_with({A: stats(max_streams=4), B: stats(max_streams=4)})
    chosen = [router.choose(KEY).address for _ in range(4)]
    assert chosen == [A, B, A, B]
    router.record_stats(A, stats(max_streams=4))                 # a fresh snapshot counts them itself
    assert router.scores(KEY)[A].active == 0


def test_locality_keeps_only_the_most_recent_keys():
    router = router_with({A: stats(), B: stats()}, locality_window=2)
    router.note_served(B, "k1")
    router.note_served(B, "k2")
    router.note_served(B, "k1")
    router.note_served(B, "k3")                                  # evicts k2, the least recent
    assert [router.scores(k)[B].locality for k in ("k1", "k2", "k3")] == [1, 0, 1]


def test_a_restarted_replica_loses_its_locality():
    router = router_with({A: stats(received=50), B: stats()})
    router.note_served(A, KEY)
    router.record_stats(A, stats(received=60))
    assert router.scores(KEY)[A].locality == 1
    router.record_stats(A, stats(received=2))                    # counters went back: a new engine
    assert router.scores(KEY)[A].locality == 0


def test_each_decision_is_logged_with_every_replica(caplog):
    router = router_with({A: stats(), B: stats(free=1)})
    router.note_served(A, KEY)
    with caplog.at_level(logging.INFO, logger="orchestrator.router"):
        router.choose(KEY)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("route ")]
    assert f"-> {A} (best score)" in line
    assert f"{A} S=1.000 C=1" in line and f"{B} S=" in line and "OVERLOADED" in line


@pytest.mark.parametrize("options", [dict(weights=(1, 1, 1)), dict(weights=(-1, 1, 1, 1)),
                                     dict(weights=(0, 0, 0, 0)), dict(overload_threshold=0),
                                     dict(refresh_s=0), dict(locality_window=0)])
def test_bad_settings_are_refused(options):
    with pytest.raises(ValueError):
        ReplicaRouter([A], **options)


def test_unknown_replica_and_duplicate_addresses_are_refused():
    with pytest.raises(ValueError, match="duplicate"):
        ReplicaRouter([A, A])
    router = ReplicaRouter([A])
    with pytest.raises(KeyError, match="unknown replica"):
        router.note_served(B, KEY)
    with pytest.raises(RuntimeError, match="not started"):
        _ = router.replica(A).stub


# --- two real replicas on loopback ----------------------------------------------------------
def closed_port_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def hold_stream(stub: inference_pb2_grpc.InferenceStub, request_id: str) -> grpc.aio.StreamStreamCall:
    """Open a prompt and leave it unfinished: it stays active and keeps its KV blocks."""
    call = stub.StreamPrompt()
    await call.write(open_msg(request_id, [seg("The quick brown fox jumps over the lazy dog. " * 10)]))
    kv_on_gpu = common_pb2.LIFECYCLE_EVENT_KIND_KV_ON_GPU
    while True:
        response = await asyncio.wait_for(call.read(), 30)
        assert response is not grpc.aio.EOF, "the stream ended early"
        if response.event.WhichOneof("kind") == "lifecycle" and response.event.lifecycle.kind == kv_on_gpu:
            return call


async def test_the_router_steers_away_from_a_busy_real_replica(embedded_model_dir):
    busy = RunningInference(embedded_model_dir, max_streams=4, kv_device_blocks=64, kv_cpu_blocks=64)
    idle = None
    router = None
    held: list[grpc.aio.StreamStreamCall] = []
    try:
        idle = RunningInference(embedded_model_dir, max_streams=4, kv_device_blocks=64, kv_cpu_blocks=64)
        dead = closed_port_address()
        router = ReplicaRouter([busy.address, idle.address, dead], refresh_s=0.1, stats_timeout_s=2.0)
        await router.start()
        assert set(router.scores(KEY)) == {busy.address, idle.address}   # the dead one is skipped
        assert router.replica(dead).unavailable == "no health answer yet"   # its Watch waits for it

        router.note_served(busy.address, KEY)
        assert router.choose(KEY).address == busy.address                 # idle replicas: locality decides

        stub = router.replica(busy.address).stub
        held += [await hold_stream(stub, f"held-{i}") for i in range(2)]
        await until(lambda: router.replica(busy.address).stats.num_active == 2)  # a periodic refresh
        view = router.scores(KEY)[busy.address]
        assert view.load == 0.5 and view.memory_use > 0 and not view.overloaded
        assert router.choose("a preamble nobody served").address == idle.address
        assert router.choose(KEY).address == busy.address                 # locality still beats half load

        held += [await hold_stream(stub, f"held-{i}") for i in range(2, 4)]
        await until(lambda: router.scores(KEY)[busy.address].overloaded)
        assert router.choose(KEY).address == idle.address                 # overloaded: skipped despite locality

        for call in held:
            call.cancel()
        await asyncio.to_thread(busy.wait_until_all_blocks_free)
        idle_address = idle.address
        idle.stop()
        idle = None
        await until(lambda: not router.replica(idle_address).available)
        assert router.choose(KEY).address == busy.address
        with pytest.raises(NoReplicaAvailable):
            router.choose(KEY, exclude={busy.address})
    finally:
        for call in held:
            call.cancel()
        if router is not None:
            await router.stop()
        for service in (busy, idle):
            if service is not None:
                service.stop()
