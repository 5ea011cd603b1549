"""How the lifecycle store's queued writes reach Redis: one `Write` per `create`, `event` or `update`
(its fields encoded as strings, `encode_field`), and one pipeline per batch of them (`store_batch`).
The queue, its bound and the retries around it: lifecycle_store.py."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis
from redis.exceptions import ResponseError

from orchestrator.lifecycle_records import (
    RECENT_KEY,
    RETRIEVER_PREFIX,
    as_text,
    events_key,
    request_key,
    state_name,
    stats_dict,
)
from protos import orchestrator_pb2

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Write:
    """One queued write: hash fields to set, maybe a stream entry, maybe an index entry."""

    request_id: str
    hash_fields: dict[str, str]
    entry: dict[str, str] | None = None
    stream_id: str = ""
    created_unix_ms: int | None = None
    attempted: bool = False  # sent in a pipeline whose connection broke: it may be stored already


def encode_field(name: str, value: Any) -> str:
    """A record field as stored: a state's short name, a retriever choice's name, stats as JSON, else text."""
    if name == "state":
        return state_name(value)
    if name == "retriever" and isinstance(value, int):
        return orchestrator_pb2.RetrieverChoice.Name(value).removeprefix(RETRIEVER_PREFIX).lower()
    if name == "stats":
        return json.dumps(stats_dict(value))
    return as_text(value)


async def store_batch(client: redis.Redis, batch: list[Write], ttl_s: int, recent_max: int,
                      wait: tuple[int, int] | None = None) -> tuple[int, object]:
    """Store `batch` in one pipeline, each touched key's expiry renewed; returns how many writes Redis
    refused, and with `wait` (replicas, ms) the answer of the `WAIT` that ends the pipeline (on its
    connection, so it waits for these writes): the replicas that acknowledged them, or an error.
    A stream entry whose id Redis already has is not stored again when it was `attempted` (the
    broken attempt stored it); else (the clock stepped back) it is appended under a new id."""
    pipe = client.pipeline(transaction=False)
    xadds: list[tuple[int, Write]] = []
    touched: dict[str, None] = {}
    indexed = False
    for write in batch:
        touched[write.request_id] = None
        if write.hash_fields:
            pipe.hset(request_key(write.request_id), mapping=write.hash_fields)
        if write.entry is not None:
            xadds.append((len(pipe), write))
            pipe.xadd(events_key(write.request_id), write.entry, id=write.stream_id)
        if write.created_unix_ms is not None:
            pipe.zadd(RECENT_KEY, {write.request_id: write.created_unix_ms})
            indexed = True
    for request_id in touched:
        pipe.expire(request_key(request_id), ttl_s)
        pipe.expire(events_key(request_id), ttl_s)
    if indexed:
        pipe.zremrangebyrank(RECENT_KEY, 0, -recent_max - 1)
        pipe.expire(RECENT_KEY, ttl_s)
    if wait is not None:
        pipe.execute_command("WAIT", *wait)
    results = await pipe.execute(raise_on_error=False)
    acked = results.pop() if wait is not None else None

    redo, refused = [], 0
    xadd_at = dict(xadds)
    for position, result in enumerate(results):
        if not isinstance(result, ResponseError):
            continue
        write = xadd_at.get(position)
        if write is not None and "equal or smaller" in str(result):
            if not write.attempted:  # the stream is ahead of our id (clock stepped back): append anyway
                redo.append(write)
            continue  # an attempted write: stored by the broken attempt
        refused += 1
        log.warning("lifecycle store: Redis refused a write: %s", result)
    if redo:
        pipe = client.pipeline(transaction=False)
        for write in redo:
            write.stream_id = "*"
            pipe.xadd(events_key(write.request_id), write.entry, id="*")
        await pipe.execute(raise_on_error=False)
    return refused, acked


class WriteProgress:
    """Writes are stored (or dropped) in the order they were queued, so two counts say whether all the
    writes queued before a given moment are done, however busy the queue stays (`LifecycleStore.confirm`)."""

    def __init__(self) -> None:
        self.queued = 0
        self.done = 0
        self._changed = asyncio.Condition()

    async def finish(self, writes: int) -> None:
        self.done += writes
        async with self._changed:
            self._changed.notify_all()

    async def reached(self, target: int, timeout_s: float) -> bool:
        """Wait until `target` writes are done; False on timeout."""
        if self.done >= target:
            return True
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.done >= target), timeout_s)
        except TimeoutError:
            return False
        return True


TERMINAL_STATES = frozenset({"FINISHED", "FAILED", "CANCELLED"})
REPLICA_WAIT_MS = 1000  # how long a batch with a terminal write waits for a replica's ack (half timeout_s at most)


class ReplicaAcks:
    """Over a Sentinel set, a batch holding a terminal state is followed by `WAIT 1`: once a replica acked,
    the record outlives the primary. No ack within REPLICA_WAIT_MS: logged and counted in `unreplicated`
    (terminal writes on the primary alone); the answer is never held for it."""

    def __init__(self, replicas: int, timeout_s: float) -> None:
        self.replicas = replicas
        self.wait_ms = min(REPLICA_WAIT_MS, int(timeout_s * 500))
        self.unreplicated = 0
        self._unacked = False

    def terminal_writes(self, batch: list[Write]) -> int:
        return sum(w.hash_fields.get("state") in TERMINAL_STATES for w in batch) if self.replicas else 0

    def wait(self, terminal: int) -> tuple[int, int] | None:
        return (self.replicas, self.wait_ms) if terminal else None

    def note(self, acked: object, terminal: int) -> None:
        if not terminal:
            return
        replicated = isinstance(acked, int) and acked >= self.replicas
        if not replicated:
            self.unreplicated += terminal
            if not self._unacked:
                log.warning("lifecycle store: no replica acknowledged terminal writes within %d ms (WAIT: %s); "
                            "they are on the primary only until one does", self.wait_ms, acked)
        elif self._unacked:
            log.info("lifecycle store: a replica acknowledges terminal writes again")
        self._unacked = not replicated
