"""Prefill/decode pairing (FlowGuard lanes) over the router's scores, on injected stats."""

from __future__ import annotations

from orchestrator.pairing import Pair, choose_pair
from orchestrator.router import ReplicaRouter
from protos import inference_pb2
from protos.metadata import DECODE_TARGET_KEY

P1, P2, D1, D2, BOTH = "prefill-1:1", "prefill-2:1", "decode-1:1", "decode-2:1", "both:1"
KEY = "You answer questions about Python using the documents below."


def stats(role: str = "", *, free: int = 100, waiting: int = 0, active: int = 0) -> inference_pb2.EngineStats:
    return inference_pb2.EngineStats(
        pools=[inference_pb2.BlockPoolStats(name="device", total_blocks=100, free_blocks=free)],
        num_waiting=waiting, num_active=active, max_concurrent_streams=10, role=role)


def router_with(snapshots: dict[str, inference_pb2.EngineStats]) -> ReplicaRouter:
    router = ReplicaRouter(list(snapshots))
    for address, snapshot in snapshots.items():
        router.record_stats(address, snapshot)
        if hasattr(router, "record_health"):     # a router that follows health checks: serving
            router.record_health(address, None)
    return router


def pair(router: ReplicaRouter) -> Pair:
    return choose_pair(router, KEY, router.choose(KEY))


def addresses(chosen: Pair) -> tuple[str, str | None]:
    return chosen.prefill.address, chosen.decode.address if chosen.decode else None


def test_replicas_without_roles_stay_colocated():
    router = router_with({BOTH: stats(), P1: stats("")})
    chosen = pair(router)
    assert chosen.decode is None and chosen.metadata == ()


def test_each_side_comes_from_its_lane_by_load_and_memory():
    router = router_with({P1: stats("prefill", active=6), P2: stats("prefill", active=1),
                          D1: stats("decode", free=10), D2: stats("decode", free=90)})
    chosen = pair(router)
    assert addresses(chosen) == (P2, D2)               # the idler prefill side, the roomier decode side
    assert chosen.metadata == ((DECODE_TARGET_KEY, D2),)


def test_the_prefill_side_is_never_a_decode_replica_even_when_the_router_prefers_it():
    router = router_with({D1: stats("decode"), P1: stats("prefill", waiting=5, active=8)})
    first = router.choose(KEY)
    assert first.address == D1                         # the router alone would put it on the decode replica
    assert addresses(choose_pair(router, KEY, first)) == (P1, D1)


def test_a_both_replica_serves_either_lane_but_not_both_sides_of_one_pair():
    router = router_with({BOTH: stats("both"), D1: stats("decode", active=9)})
    assert addresses(pair(router)) == (BOTH, D1)
    router = router_with({BOTH: stats("both"), P1: stats("prefill", active=9)})
    assert addresses(pair(router)) == (BOTH, None)    # the only decode-capable replica is the prefill side


def test_no_live_decode_replica_means_colocated_on_the_prefill_side():
    router = router_with({P1: stats("prefill"), D1: stats("decode")})
    router.mark_failed(D1, "down")
    assert addresses(pair(router)) == (P1, None)


def test_no_live_prefill_replica_means_colocated_where_the_router_says():
    router = router_with({P1: stats("prefill"), D1: stats("decode")})
    router.mark_failed(P1, "down")
    assert addresses(pair(router)) == (D1, None)
