"""The orchestrator's record of every request, kept in Redis.

Per request, two keys that expire `ttl_s` after their last write:
- a hash `streamrag:req:<id>`: question, state, replica, retriever, streamed,
  created_unix_ms, updated_unix_ms, answer, ttft_from_question_s,
  ttft_from_retrieval_end_s, error, stats (RequestStats as a JSON object);
- a Redis Stream `streamrag:req:<id>:events`: one entry per event, with fields `kind`,
  `unix_ms` and the event's own fields, all strings.
Plus `streamrag:requests:recent`, a sorted set of request ids scored by creation time and
trimmed to the newest `recent_max`.

Writes never block or fail the answer path: `create`, `event` and `update` only append to an
in-memory queue that one background task pipelines to Redis in order. While Redis is
unreachable the queue keeps the writes (at most `buffer_max`; beyond that the oldest are
dropped and counted) and the writer retries with backoff, and at once when a new request
is created (redis-py dials again on each try, so a Redis that is back serves the next
request). When writes get through again, every request that had writes waiting or dropped
gets a `REDIS_GAP` event with `since_unix_ms`, `until_unix_ms` and `dropped` (its writes lost).

Stream entry ids ("<ms>-<seq>") are assigned when an event is recorded, not when it reaches
Redis, so a request's events read back in the order they were recorded, across an outage
too, and a batch re-sent after a connection broke mid-write is not stored twice.

Over a Sentinel URL (`servicekit.redis_url`) the client follows the primary through a failover, and
a batch holding a terminal state (FINISHED, FAILED, CANCELLED) ends with `WAIT 1`, so a record
acknowledged by a replica survives the primary's loss (see `unreplicated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import Any

import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from orchestrator.lifecycle_records import (
    RECENT_KEY,
    REDIS_GAP,
    StoredEvent,
    StoredRequest,
    StoreUnavailable,
    as_text,
    events_key,
    lifecycle_kind_name,
    now_ms,
    request_key,
    to_proto,
)
from orchestrator.lifecycle_writes import ReplicaAcks, Write, WriteProgress, encode_field, store_batch
from servicekit.redis_url import parse_redis_url, redis_client

__all__ = ["RECENT_KEY", "REDIS_GAP", "REDIS_UNREACHABLE", "LifecycleStore", "StoreUnavailable", "StoredEvent",
           "StoredRequest", "events_key", "lifecycle_kind_name", "now_ms", "request_key", "to_proto"]

log = logging.getLogger(__name__)

REDIS_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)
_BATCH_MAX = 500  # writes per pipeline
_STREAM_IDS_KEPT = 20_000  # requests whose last stream id is remembered


class LifecycleStore:
    """Records request lifecycles in Redis without ever making the caller wait for Redis.

    `create`, `event` and `update` enqueue and return at once; `get` and `recent` read Redis
    (plus writes still queued, for `get`) and raise `StoreUnavailable` when it is down.
    Counters: `dropped` (writes lost to the buffer bound), `write_errors` (writes Redis
    refused), `pending` (writes not yet stored), `available` (the last write got through).
    """

    def __init__(self, url: str, *, ttl_s: int = 86_400, recent_max: int = 1000, buffer_max: int = 10_000,
                 retry_s: float = 0.5, retry_max_s: float = 5.0, timeout_s: float = 2.0) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self.recent_max = recent_max
        self.buffer_max = buffer_max
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.timeout_s = timeout_s
        self.dropped = 0
        self.write_errors = 0
        self._acks = ReplicaAcks(1 if parse_redis_url(url).replicated else 0, timeout_s)
        self._redis: redis.Redis | None = None
        self._writer: asyncio.Task[None] | None = None
        self._queue: deque[Write] = deque()
        self._inflight: list[Write] = []
        self._wakeup = asyncio.Event()
        self._retry_now = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._progress = WriteProgress()
        self._failures = 0  # consecutive failed write attempts
        self._gap_since: int | None = None  # when writes started waiting or getting dropped
        self._gap: dict[str, int] = {}  # request id -> its writes dropped since `_gap_since`
        self._last_ids: OrderedDict[str, tuple[int, int]] = OrderedDict()

    # -- life -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect lazily and start the background writer; Redis need not be up yet."""
        if self._writer is not None:
            return
        self._redis = redis_client(self.url, timeout_s=self.timeout_s)   # over Sentinel: retried through a failover
        self._writer = asyncio.create_task(self._write_loop(), name="lifecycle-store-writer")

    async def close(self, timeout_s: float = 5.0) -> int:
        """Flush what can be flushed within `timeout_s`, stop; returns the writes left unstored."""
        if self._writer is not None:
            await self.flush(timeout_s)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        if self.pending:
            log.warning("lifecycle store closed with %d writes not stored in Redis", self.pending)
        return self.pending

    async def __aenter__(self) -> LifecycleStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued write is stored (retrying now if Redis was down); False on timeout."""
        self._retry_now.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def confirm(self, timeout_s: float) -> bool:
        """Wait until the writes queued so far (not later ones) are stored; False on timeout (they stay
        queued, and are retried as usual)."""
        self._retry_now.set()
        return await self._progress.reached(self._progress.queued, timeout_s)

    @property
    def pending(self) -> int:
        """Writes not yet stored in Redis."""
        return len(self._queue) + len(self._inflight)

    @property
    def available(self) -> bool:
        """False while the last write attempt could not reach Redis."""
        return self._failures == 0

    # -- writes (enqueue only) ---------------------------------------------------------------

    async def create(self, request_id: str, question: str, *, retriever: int | str, streamed: bool,
                     replica: str = "") -> None:
        """Record a new request (state RECEIVED) and add it to the recent index.

        `retriever` is a `RetrieverChoice` value (stored as its lower-case short name, "anns")
        or the names of the retrievers used, comma-separated ("anns,crawler", "none").
        """
        now = now_ms()
        fields = {"question": question, "state": "RECEIVED", "replica": replica,
                  "retriever": encode_field("retriever", retriever), "streamed": as_text(streamed),
                  "created_unix_ms": str(now), "updated_unix_ms": str(now)}
        self._enqueue(Write(request_id, fields, created_unix_ms=now))
        if self._failures:   # Redis was down: try now rather than after the back-off, so a Redis that
            self._retry_now.set()   # is back stores the next request's writes as they come

    async def event(self, request_id: str, kind: str | int, *, unix_ms: int | None = None, **fields: Any) -> None:
        """Append an event to the request's stream and bump its updated_unix_ms.

        `kind` is a string ("RETRIEVAL_CHUNK", "QUEUED", "FIRST_TOKEN", ...) or a
        `LifecycleEventKind` value; `unix_ms` is when it happened (default: now); the other
        keyword arguments are stored as strings (bools as "1"/"0"; None is left out).
        """
        name = lifecycle_kind_name(kind) if isinstance(kind, int) else kind
        self._enqueue(self._event_write(request_id, name, unix_ms, fields))

    async def update(self, request_id: str, **fields: Any) -> None:
        """Set hash fields and bump updated_unix_ms; a None value leaves its field as it is.

        The record's fields: `state` (a `RequestState` value or its name, with or without the
        prefix: stored as the short name, "FINISHED"), `replica`, `retriever` (see `create`),
        `streamed`, `answer`, `error`, `ttft_from_question_s`, `ttft_from_retrieval_end_s`,
        `stats` (a `RequestStats` or a mapping of its fields). Any other name (e.g.
        `finish_reason`) is stored as a string and read back in `StoredRequest.extra`.
        """
        encoded = {name: encode_field(name, value) for name, value in fields.items() if value is not None}
        if encoded:
            encoded["updated_unix_ms"] = str(now_ms())
            self._enqueue(Write(request_id, encoded))

    # -- reads --------------------------------------------------------------------------------

    async def get(self, request_id: str) -> StoredRequest | None:
        """The request's fields and events in recorded order (writes still queued included); None if unknown."""
        client = self._client()
        queued = [w for w in (*self._inflight, *self._queue) if w.request_id == request_id]
        try:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hgetall(request_key(request_id))
                pipe.xrange(events_key(request_id))
                fields, entries = await pipe.execute()
        except REDIS_UNREACHABLE as exc:
            raise StoreUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc
        if not fields and not entries and not queued:
            return None
        stored_ids = {stream_id for stream_id, _ in entries}
        for write in queued:  # hash fields are idempotent; entries already stored are skipped
            fields.update(write.hash_fields)
            if write.entry is not None and write.stream_id not in stored_ids:
                entries.append((write.stream_id, write.entry))
        return StoredRequest.from_redis(request_id, fields, entries)

    async def recent(self, limit: int = 50) -> list[StoredRequest]:
        """The newest `limit` requests in Redis, newest first, without their events."""
        client = self._client()
        if limit <= 0:
            return []
        try:
            ids = await client.zrevrange(RECENT_KEY, 0, limit - 1)
            async with client.pipeline(transaction=False) as pipe:
                for request_id in ids:
                    pipe.hgetall(request_key(request_id))
                hashes = await pipe.execute()
        except REDIS_UNREACHABLE as exc:
            raise StoreUnavailable(f"Redis at {self.url} is unreachable: {exc}") from exc
        return [StoredRequest.from_redis(rid, fields) for rid, fields in zip(ids, hashes, strict=True) if fields]

    # -- the writer ---------------------------------------------------------------------------

    def _client(self) -> redis.Redis:
        if self._redis is None:
            raise RuntimeError("LifecycleStore.start() was not called")
        return self._redis

    def _event_write(self, request_id: str, kind: str, unix_ms: int | None, fields: Mapping[str, Any]) -> Write:
        now = now_ms()
        entry = {"kind": kind, "unix_ms": str(unix_ms or now)}
        entry.update((name, as_text(value)) for name, value in fields.items() if value is not None)
        return Write(request_id, {"updated_unix_ms": str(now)}, entry, self._next_stream_id(request_id, now))

    def _next_stream_id(self, request_id: str, now_ms: int) -> str:
        """Strictly increasing per request, even if the clock stands still or steps back."""
        last = self._last_ids.get(request_id)
        ms, seq = (last[0], last[1] + 1) if last is not None and now_ms <= last[0] else (now_ms, 0)
        self._last_ids[request_id] = (ms, seq)
        self._last_ids.move_to_end(request_id)
        if len(self._last_ids) > _STREAM_IDS_KEPT:
            self._last_ids.popitem(last=False)
        return f"{ms}-{seq}"

    def _enqueue(self, write: Write) -> None:
        if self._failures:
            self._note_gap(write.request_id, 0)
        self._queue.append(write)
        self._progress.queued += 1
        self._trim()
        self._idle.clear()
        self._wakeup.set()

    def _trim(self) -> None:
        """Drop the oldest queued writes beyond `buffer_max` (a batch in flight is not counted)."""
        while len(self._queue) > self.buffer_max:
            lost = self._queue.popleft()
            self.dropped += 1
            self._progress.done += 1
            self._note_gap(lost.request_id, 1)

    def _note_gap(self, request_id: str, dropped: int) -> None:
        if self._gap_since is None:
            self._gap_since = now_ms()
        if request_id in self._gap or len(self._gap) < self.buffer_max:
            self._gap[request_id] = self._gap.get(request_id, 0) + dropped

    async def _write_loop(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self._inflight = [self._queue.popleft() for _ in range(min(len(self._queue), _BATCH_MAX))]
            try:
                await self._write(self._inflight)
            except REDIS_UNREACHABLE as exc:
                self._on_unreachable(exc)
                await self._backoff()
                continue
            except Exception:  # a bug or a refused batch must not stop the writer
                log.exception("lifecycle store: dropping %d writes", len(self._inflight))
                self.write_errors += len(self._inflight)
            await self._progress.finish(len(self._inflight))
            self._inflight = []
            self._on_written()

    async def _write(self, batch: list[Write]) -> None:
        terminal = self._acks.terminal_writes(batch)
        refused, acked = await store_batch(self._client(), batch, self.ttl_s, self.recent_max,
                                           wait=self._acks.wait(terminal))
        self.write_errors += refused
        self._acks.note(acked, terminal)

    @property
    def wait_replicas(self) -> int:
        """Replicas a terminal write waits for (1 over a Sentinel set, else 0)."""
        return self._acks.replicas

    @property
    def unreplicated(self) -> int:
        """Terminal writes no replica acknowledged in time (on the primary alone)."""
        return self._acks.unreplicated

    def _on_unreachable(self, exc: Exception) -> None:
        for write in self._inflight:
            write.attempted = True
        self._queue.extendleft(reversed(self._inflight))
        self._inflight = []
        if self._failures == 0:
            log.warning("lifecycle store: Redis unreachable (%s); buffering writes", exc)
            for write in self._queue:
                self._note_gap(write.request_id, 0)
        self._failures += 1
        self._trim()

    def _on_written(self) -> None:
        if self._failures:
            log.info("lifecycle store: Redis reachable again after %d failed attempts", self._failures)
        self._failures = 0
        if self._gap_since is None:
            return
        since, until, gap = self._gap_since, now_ms(), self._gap
        self._gap_since, self._gap = None, {}
        for request_id, dropped in gap.items():
            self._enqueue(self._event_write(request_id, REDIS_GAP, until, {
                "since_unix_ms": since, "until_unix_ms": until, "dropped": dropped}))

    async def _backoff(self) -> None:
        delay = min(self.retry_s * 2 ** min(self._failures - 1, 16), self.retry_max_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._retry_now.wait(), delay)
        self._retry_now.clear()
