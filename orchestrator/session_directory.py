"""Where each session lives and what it needs to be rebuilt, kept in Redis (the orchestrator
itself stays stateless: any orchestrator process can serve any session).

Per session, keys that expire `ttl_s` after their last write:
- `streamrag:session:<id>`: hash with replica, tenant (the tenant that created it: only its keys, an
  admin tenant's and the operator's reach it; absent on sessions created before tenants: ""),
  instructions, retention_tokens, created_unix_ms, updated_unix_ms, data_version;
- `streamrag:session:<id>:batches`: list, one JSON array of segment texts per ingest batch,
  oldest first, at most `max_batches` (the data a replica can be rebuilt from);
- `streamrag:session:<id>:flash`: hash, registered question -> max_tokens.
Plus `streamrag:sessions`, the set of open session ids. Session events go to the lifecycle
store's event stream of the id `session:<id>` (see lifecycle_store.py).

Unlike the lifecycle store's buffered writes, these calls go to Redis at once: routing a session
needs an answer. While Redis is unreachable each call is tried again for up to `wait_s`
(failures.WAIT_FOR_PEER_S: a Redis that restarts is back within it), then raises `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

import redis.asyncio as redis

from orchestrator.failures import WAIT_FOR_PEER_S
from orchestrator.lifecycle_store import REDIS_UNREACHABLE, StoreUnavailable, now_ms
from servicekit.redis_url import redis_client

log = logging.getLogger(__name__)

SESSIONS_KEY = "streamrag:sessions"
DEFAULT_MAX_BATCHES = 10_000
RETRY_S = 0.25                 # between tries while Redis is unreachable


def session_key(session_id: str) -> str:
    return f"streamrag:session:{session_id}"


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    replica: str
    instructions: str
    retention_tokens: int
    data_version: int
    tenant: str = ""               # who owns it (orchestrator/tenancy.py); "" before tenants, or none


class SessionDirectory:
    def __init__(self, url: str, *, ttl_s: int = 86_400, max_batches: int = DEFAULT_MAX_BATCHES,
                 timeout_s: float = 2.0, wait_s: float = WAIT_FOR_PEER_S) -> None:
        self.url = url
        self.wait_s = wait_s
        self.unreachable = 0             # tries that found Redis unreachable
        self.ttl_s = ttl_s
        self.max_batches = max_batches
        # Over a Sentinel URL, calls are retried with backoff while a replica is promoted (redis_url).
        self._redis = redis_client(url, timeout_s=timeout_s)

    async def close(self) -> None:
        await self._redis.aclose()

    async def _do(self, fn):
        """`fn(redis)`, tried again while Redis is unreachable, for up to `wait_s` (a restart)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                return await fn(self._redis)
            except REDIS_UNREACHABLE as exc:
                self.unreachable += 1
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(f"the session directory (Redis at {self.url}) is unreachable: "
                                           f"{exc}") from exc
                log.info("session directory: Redis at %s unreachable (%s); trying again", self.url, exc)
            await asyncio.sleep(RETRY_S)

    async def create(self, session_id: str, replica: str, instructions: str, retention_tokens: int,
                     tenant: str = "") -> bool:
        """Record a new session of `tenant`; False if the id is taken."""
        key = session_key(session_id)
        now = str(now_ms())

        async def write(r: redis.Redis) -> bool:   # a try cut after its SADD leaves no hash: tried again, it goes on
            if not await r.sadd(SESSIONS_KEY, session_id) and await r.exists(key):
                return False
            async with r.pipeline(transaction=True) as pipe:
                pipe.delete(key, f"{key}:batches", f"{key}:flash")
                pipe.hset(key, mapping={"replica": replica, "tenant": tenant, "instructions": instructions,
                                        "retention_tokens": str(retention_tokens), "data_version": "0",
                                        "created_unix_ms": now, "updated_unix_ms": now})
                pipe.expire(key, self.ttl_s)
                await pipe.execute()
            return True

        return await self._do(write)

    async def get(self, session_id: str) -> SessionRecord | None:
        fields = await self._do(lambda r: r.hgetall(session_key(session_id)))
        if not fields:
            return None
        return SessionRecord(session_id, fields.get("replica", ""), fields.get("instructions", ""),
                             int(fields.get("retention_tokens", 0)), int(fields.get("data_version", 0)),
                             fields.get("tenant", ""))

    async def ids(self) -> list[str]:
        return sorted(await self._do(lambda r: r.smembers(SESSIONS_KEY)))

    async def set_replica(self, session_id: str, replica: str) -> None:
        await self._touch(session_id, replica=replica)

    async def add_batch(self, session_id: str, texts: list[str], data_version: int) -> None:
        key = session_key(session_id)

        async def write(r: redis.Redis) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.rpush(f"{key}:batches", json.dumps(texts))
                pipe.ltrim(f"{key}:batches", -self.max_batches, -1)
                pipe.hset(key, mapping={"data_version": str(data_version),
                                        "updated_unix_ms": str(now_ms())})
                for name in (key, f"{key}:batches", f"{key}:flash"):
                    pipe.expire(name, self.ttl_s)
                await pipe.execute()

        await self._do(write)

    async def batches(self, session_id: str) -> list[list[str]]:
        raw = await self._do(lambda r: r.lrange(f"{session_key(session_id)}:batches", 0, -1))
        return [json.loads(batch) for batch in raw]

    async def set_flash(self, session_id: str, question: str, max_tokens: int | None) -> None:
        """Record a Flash Query (`max_tokens` None: remove it)."""
        name = f"{session_key(session_id)}:flash"
        if max_tokens is None:
            await self._do(lambda r: r.hdel(name, question))
        else:
            await self._do(lambda r: r.hset(name, question, str(max_tokens)))

    async def flash(self, session_id: str) -> dict[str, int]:
        raw = await self._do(lambda r: r.hgetall(f"{session_key(session_id)}:flash"))
        return {question: int(tokens) for question, tokens in raw.items()}

    async def delete(self, session_id: str) -> None:
        key = session_key(session_id)

        async def write(r: redis.Redis) -> None:
            async with r.pipeline(transaction=True) as pipe:
                pipe.srem(SESSIONS_KEY, session_id)
                pipe.delete(key, f"{key}:batches", f"{key}:flash")
                await pipe.execute()

        await self._do(write)

    async def _touch(self, session_id: str, **fields: str) -> None:
        fields["updated_unix_ms"] = str(now_ms())
        await self._do(lambda r: r.hset(session_key(session_id), mapping=fields))
