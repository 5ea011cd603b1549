"""Pick an inference replica for each request among those whose health says SERVING.

Each available replica is scored from its latest `Inference.GetStats` snapshot (polled once in
`start()`, then every `refresh_s`) as `orchestrator.scoring` says (FlowGuard: prefix locality,
memory use, queue, load). Overloaded replicas are skipped; the best score wins (ties: lower load,
then the order replicas were added); when every candidate is overloaded, the shortest queue wins
(fewest q, then fewest active, then order). Every decision is logged at INFO with each replica's
breakdown.

Availability follows each replica's own health, as gRPC reports it: the router keeps one
`grpc.health.v1.Health.Watch` open per replica, opened with `wait_for_ready`, so it waits on
the channel's own reconnection (`servicekit.channels`: back-off capped at 2 s, keepalive
pings) instead of polling. A replica is available from the moment its Watch says SERVING (the
router reads its GetStats then, so a restarted replica is scored on its own fresh figures)
until the Watch says anything else or breaks (the process died, or, found by keepalive, stopped
answering), or a call to it fails (`mark_failed`: the Watch is opened afresh, and a replica that
is in fact fine is available again at its first answer). A failed GetStats poll only keeps the
last snapshot. When no replica is available, `choose_ready` waits, for a bounded time, for the
first one to become available: a replica that is back is used by the very next request.

Replicas come and go while the router runs (`orchestrator.discovery`): `add_replica` watches a
new one; `retire_replica` drains one from routing (no new request goes to it; calls open on it
keep their channel until `forget`, and fail over as any failure does if the replica goes away).
`notes` says why a source (a DNS name) has no replica now; a request that finds none is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.scoring import DEFAULT_WEIGHTS, ScoreBreakdown, normalised_weights, score_replicas
from protos import inference_pb2, inference_pb2_grpc
from servicekit.channels import open_channel

log = logging.getLogger(__name__)

NO_HEALTH_YET = "no health answer yet"
SERVING = health_pb2.HealthCheckResponse.SERVING
WATCH_RETRY_S = 0.5    # before opening a Watch again that failed without one answer

ChannelFactory = Callable[[str], grpc.aio.Channel]


class NoReplicaAvailable(RuntimeError):
    """No replica is available (or every available one was excluded)."""


@dataclass(eq=False)
class Replica:
    """One inference replica: its address, its stub, and what the router knows about it."""

    address: str
    stats: inference_pb2.EngineStats | None = None
    unavailable: str | None = NO_HEALTH_YET   # why it is skipped; None while its health says SERVING
    routed: int = 0                           # requests sent since the last snapshot
    recent_keys: OrderedDict[str, None] = field(default_factory=OrderedDict)
    channel: grpc.aio.Channel | None = None
    _stub: inference_pb2_grpc.InferenceStub | None = None
    _watcher: asyncio.Task | None = None
    _answered: asyncio.Event = field(default_factory=asyncio.Event)   # its health answered once

    @property
    def available(self) -> bool:
        return self.unavailable is None and self.stats is not None

    @property
    def stub(self) -> inference_pb2_grpc.InferenceStub:
        if self._stub is None:
            raise RuntimeError(f"replica {self.address}: the router is not started")
        return self._stub


class ReplicaRouter:
    """Chooses a replica per request among those whose health says SERVING, by their `GetStats` snapshots."""

    def __init__(self, addresses: Sequence[str], *, weights: Sequence[float] = DEFAULT_WEIGHTS,
                 overload_threshold: float = 0.9, refresh_s: float = 1.0, locality_window: int = 256,
                 stats_timeout_s: float = 2.0, channel_factory: ChannelFactory | None = None) -> None:
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"duplicate replica addresses: {list(addresses)}")
        if not 0 < overload_threshold <= 1:
            raise ValueError(f"overload_threshold must be in (0, 1], got {overload_threshold}")
        if refresh_s <= 0 or stats_timeout_s <= 0 or locality_window < 1:
            raise ValueError("refresh_s and stats_timeout_s must be > 0 and locality_window >= 1")
        self.weights = normalised_weights(weights)
        self.overload_threshold = overload_threshold
        self.refresh_s = refresh_s
        self.locality_window = locality_window
        self.stats_timeout_s = stats_timeout_s
        self._channel_factory = channel_factory or open_channel
        self._replicas = {address: Replica(address) for address in addresses}
        self._retired: dict[str, Replica] = {}    # drained from routing; their calls may still run
        self.notes: dict[str, str] = {}           # source -> why it has no replica now (discovery)
        self._started = False
        self._refresher: asyncio.Task | None = None
        self._changed = asyncio.Event()         # set (and replaced) whenever a replica becomes available

    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def replica(self, address: str) -> Replica:
        """A replica routed to now, or one retired (whose calls may still run)."""
        replica = self._replicas.get(address) or self._retired.get(address)
        if replica is None:
            raise KeyError(f"unknown replica {address!r}")
        return replica

    def add_replica(self, address: str) -> Replica:
        """A replica found while the router runs: watched (and so polled) from now on."""
        if address in self._replicas:
            return self._replicas[address]
        replica = self._retired.pop(address, None) or Replica(address)
        replica.unavailable = NO_HEALTH_YET
        self._replicas[address] = replica
        log.info("replica %s added", address)
        if self._started:
            self._open(replica)
        return replica

    def retire_replica(self, address: str, reason: str) -> None:
        """Drain a replica from routing: no new request is sent to it (its open calls go on)."""
        replica = self._replicas.pop(address, None)
        if replica is None:
            return
        if replica._watcher is not None:
            replica._watcher.cancel()
            replica._watcher = None
        replica.unavailable = reason
        self._retired[address] = replica
        log.warning("replica %s retired: %s", address, reason)

    async def forget(self, address: str) -> None:
        """Close a retired replica's channel (a call still open on it ends) and forget it."""
        replica = self._retired.pop(address, None)
        if replica is not None and replica.channel is not None:
            await replica.channel.close()

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Open a channel and a health Watch per replica, poll GetStats once, then every `refresh_s`.
        Returns once every replica's health answered, or after `stats_timeout_s` (one that is down
        is used once it is up)."""
        self._started = True
        for replica in self._replicas.values():
            self._open(replica)
        await self.refresh()
        waits = [asyncio.create_task(r._answered.wait()) for r in self._replicas.values()]
        _, pending = await asyncio.wait(waits, timeout=self.stats_timeout_s) if waits else ((), ())
        for task in pending:
            task.cancel()
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_forever(), name="replica-router-refresh")

    def _open(self, replica: Replica) -> None:   # a channel, a stub and a health Watch
        if replica.channel is None:
            replica.channel = self._channel_factory(replica.address)
            replica._stub = inference_pb2_grpc.InferenceStub(replica.channel)
        if replica._watcher is None:
            self._start_watch(replica)

    async def stop(self) -> None:
        self._started = False
        everyone = [*self._replicas.values(), *self._retired.values()]
        tasks = [self._refresher, *(r._watcher for r in everyone)]
        self._refresher = None
        for replica in everyone:
            replica._watcher = None
        for task in tasks:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for replica in everyone:
            if replica.channel is not None:
                await replica.channel.close()
                replica.channel, replica._stub = None, None

    async def __aenter__(self) -> ReplicaRouter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def refresh(self) -> None:
        """Poll every replica's GetStats now (concurrently)."""
        await asyncio.gather(*(self._poll(r) for r in list(self._replicas.values()) if r._stub is not None))

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def _poll(self, replica: Replica) -> None:
        """Read the replica's GetStats; a failure keeps the last snapshot (health decides availability)."""
        try:
            response = await replica.stub.GetStats(inference_pb2.GetStatsRequest(), timeout=self.stats_timeout_s)
        except grpc.aio.AioRpcError as exc:
            log.debug("replica %s: GetStats failed: %s", replica.address, exc.code().name)
        except Exception as exc:   # keep the refresh loop alive whatever one replica does
            log.debug("replica %s: GetStats failed: %r", replica.address, exc)
        else:
            if replica.address in self._replicas:     # not retired meanwhile
                self.record_stats(replica.address, response.stats)

    # --- health ------------------------------------------------------------------------
    def _start_watch(self, replica: Replica) -> None:
        replica._watcher = asyncio.create_task(self._watch(replica), name=f"replica-health-{replica.address}")

    async def _watch(self, replica: Replica) -> None:
        """Follow the replica's health for as long as the router runs: a Watch, opened again
        whenever it ends; `wait_for_ready` makes each wait for the channel to be connected."""
        stub = health_pb2_grpc.HealthStub(replica.channel)
        while True:
            answered = False
            try:
                async for response in stub.Watch(health_pb2.HealthCheckRequest(), wait_for_ready=True):
                    answered = True
                    if response.status == SERVING:
                        await self._poll(replica)       # fresh figures before it is chosen again
                        self.record_health(replica.address, None)
                    else:
                        status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
                        self.record_health(replica.address, f"health {status}")
                    replica._answered.set()
                reason = "health watch ended"
            except grpc.aio.AioRpcError as exc:
                reason = f"health watch failed: {exc.code().name} ({exc.details()})"
            self.record_health(replica.address, reason)
            if not answered:
                await asyncio.sleep(WATCH_RETRY_S)

    # --- what the router learns ----------------------------------------------------------
    def record_stats(self, address: str, stats: inference_pb2.EngineStats) -> None:
        """A fresh snapshot: `routed` starts over."""
        replica = self.replica(address)
        previous = replica.stats
        if previous is not None and stats.counters.requests_received < previous.counters.requests_received:
            log.info("replica %s restarted (requests_received went down): forgetting its prefix locality", address)
            replica.recent_keys.clear()
        was = replica.available
        replica.stats, replica.routed = stats, 0
        if replica.available and not was:
            self._notify()

    def record_health(self, address: str, unavailable: str | None) -> None:
        """What the replica's health says: None when SERVING, else why it is not to be used."""
        replica = self.replica(address)
        if unavailable is None and replica.unavailable is not None:
            if replica.unavailable != NO_HEALTH_YET:
                log.info("replica %s is serving again", address)
        elif unavailable is not None and replica.unavailable is None:
            log.warning("replica %s unavailable: %s", address, unavailable)
        was = replica.available
        replica.unavailable = unavailable
        if replica.available and not was:
            self._notify()

    def mark_failed(self, address: str, reason: str = "marked failed") -> None:
        """A call to this replica failed: skip it until a fresh health Watch says SERVING (at once
        if the replica is fine, once it is back if it is not)."""
        replica = self.replica(address)
        self.record_health(address, reason)
        if replica._watcher is not None and address in self._replicas:
            replica._watcher.cancel()
            self._start_watch(replica)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def note_served(self, address: str, prefix_key: str) -> None:
        """The replica served a request with this prefix: its prefix cache likely holds it."""
        if not prefix_key:
            return
        keys = self.replica(address).recent_keys
        keys[prefix_key] = None
        keys.move_to_end(prefix_key)
        while len(keys) > self.locality_window:
            keys.popitem(last=False)

    # --- decisions -----------------------------------------------------------------------
    def scores(self, prefix_key: str) -> dict[str, ScoreBreakdown]:
        """The breakdown of every reachable replica, in `addresses` order."""
        reachable = [r for r in self._replicas.values() if r.available]
        return score_replicas(reachable, prefix_key, self.weights, self.overload_threshold)

    def choose(self, prefix_key: str, exclude: Collection[str] = frozenset()) -> Replica:
        """The replica for a request whose prompt starts with `prefix_key`; never one in `exclude`."""
        breakdown = self.scores(prefix_key)
        candidates = [a for a in breakdown if a not in exclude]
        if not candidates:
            raise NoReplicaAvailable(self._why_none(exclude))
        fit = [a for a in candidates if not breakdown[a].overloaded]
        if fit:
            # max() keeps the first of equal keys, so exact ties go to the order of `addresses`.
            chosen = max(fit, key=lambda a: (breakdown[a].score, -breakdown[a].load))
            how = "best score"
        else:
            chosen = min(candidates, key=lambda a: (breakdown[a].queue_depth, breakdown[a].active))
            how = "all overloaded: shortest queue"
        replica = self._replicas[chosen]
        replica.routed += 1
        log.info("route key=%s -> %s (%s) | %s", _short(prefix_key), chosen, how,
                 self._describe(breakdown, exclude))
        return replica

    async def choose_ready(self, prefix_key: str, exclude: Collection[str] = frozenset(),
                           wait_s: float = 0.0) -> Replica:
        """`choose`; when no replica is available, wait up to `wait_s` for one to become
        available (its health says SERVING again) instead of raising at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            changed = self._changed
            try:
                return self.choose(prefix_key, exclude)
            except NoReplicaAvailable:
                if loop.time() >= deadline:
                    raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), deadline - loop.time())

    def _describe(self, breakdown: dict[str, ScoreBreakdown], exclude: Collection[str]) -> str:
        parts = []
        for address, replica in self._replicas.items():
            if address in breakdown:
                parts.append(f"{address} {breakdown[address]}" + (" EXCLUDED" if address in exclude else ""))
            else:
                parts.append(f"{address} unavailable ({replica.unavailable})")
        return " | ".join(parts)

    def _why_none(self, exclude: Collection[str]) -> str:
        reasons = [f"{a}: {'excluded' if a in exclude and r.available else r.unavailable or 'no stats'}"
                   for a, r in self._replicas.items()]
        reasons += [f"{source}: {note}" for source, note in self.notes.items()]
        return "no inference replica available (" + ("; ".join(reasons) or "none known") + ")"


def _short(key: str, limit: int = 24) -> str:
    return repr(key if len(key) <= limit else key[: limit - 3] + "...")
