"""Tenants' limits, held in Redis so that every orchestrator enforces one limit.

Per tenant with limits (servicekit/tenants.py), under `streamrag:tenant:<name>:`:

- `concurrent`: a sorted set of the requests in flight, each scored with the end of its lease
  (`LEASE_S`, 30 s, `--tenant-lease`), which the orchestrator serving it renews every third of a
  lease while it runs (`renew`, from admission.py's heartbeat), so the slots of an orchestrator that
  died free within a lease; a request that ends removes itself. Only an Ask still in it may be resumed as admitted
  (`resumed`); any other resume (of an Ask that ended) is checked as new;
- `requests`, `tokens`: token buckets (a hash: level and when it was last set) that refill at
  the per-minute rate up to it. A request takes one request; its prompt and generated tokens are
  charged when it ends, so the tokens bucket may go below zero, and no request starts until it
  is back above zero.

One Lua script checks all three and takes a slot and a request, atomically (`ADMIT`), on Redis's
clock. A request over a limit is refused with `OverLimit`: which limit, the seconds until a retry
can succeed, and OpenAI's `x-ratelimit-*` values, which go out as the call's trailing metadata
with RESOURCE_EXHAUSTED (`refuse`), and from the gateway as a 429's headers.

With Redis unreachable the limits fail open: requests go on, each counted in
`streamrag_tenant_limits_unenforced_total` and the outage logged once. After `FAIL_OPEN_S` of
outage each orchestrator enforces the limits on its own in memory (the same rules, per process)
until Redis answers again, so a long outage does not leave a tenant unlimited.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc
from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import RedisError

from protos.metadata import RATE_LIMIT_PREFIX, RETRY_AFTER_KEY
from servicekit.redis_url import redis_client
from servicekit.tenants import LEASE_S, Tenant

log = logging.getLogger(__name__)

FAIL_OPEN_S = 60.0
REDIS_TIMEOUT_S = 0.5
PREFIX = "streamrag:tenant:"

# KEYS: concurrent, requests, tokens. ARGV: request id, max_concurrent, rpm, tpm (0: no limit), lease (s), resumed
# (1: an Ask re-issued after its orchestrator died: while still in flight it keeps its slot, takes no request).
# Returns {over ('' when admitted), retry_after_s, requests left, tokens left, now} as strings.
_BUCKET = """
local function level_of(key, per_minute, now)
  local v = redis.call('HMGET', key, 'level', 'at')
  local level = tonumber(v[1]) or per_minute
  local at = tonumber(v[2]) or now
  return math.min(per_minute, level + math.max(0, now - at) * per_minute / 60)
end
local function store(key, level, per_minute, now)
  redis.call('HSET', key, 'level', level, 'at', now)
  redis.call('EXPIRE', key, math.ceil((per_minute - level) * 60 / per_minute) + 1)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""
ADMIT = _BUCKET + """
local rid, maxc, rpm, tpm, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local over, retry, requests, tokens = '', 0, -1, -1
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[6] == '1' and redis.call('ZSCORE', KEYS[1], rid) then
  redis.call('ZADD', KEYS[1], now + lease, rid)
  if rpm > 0 then requests = level_of(KEYS[2], rpm, now) end
  if tpm > 0 then tokens = level_of(KEYS[3], tpm, now) end
  return {over, '0', tostring(requests), tostring(tokens), tostring(now)}
end
if maxc > 0 and redis.call('ZCARD', KEYS[1]) >= maxc then over, retry = 'max_concurrent', 1 end
if rpm > 0 then
  requests = level_of(KEYS[2], rpm, now)
  if requests < 1 and over == '' then over, retry = 'requests_per_minute', (1 - requests) * 60 / rpm end
end
if tpm > 0 then
  tokens = level_of(KEYS[3], tpm, now)
  if tokens <= 0 and over == '' then over, retry = 'tokens_per_minute', (1 - tokens) * 60 / tpm end
end
if over == '' then
  redis.call('ZADD', KEYS[1], now + lease, rid)
  redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1)
  if rpm > 0 then
    requests = requests - 1
    store(KEYS[2], requests, rpm, now)
  end
end
return {over, tostring(retry), tostring(requests), tostring(tokens), tostring(now)}
"""
# KEYS: concurrent. ARGV: request id, lease (s). Extends a request's lease if it still holds its slot: 1, else 0.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local lease = tonumber(ARGV[2])
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(lease * 1000) + 1)
return 1
"""
# KEYS: concurrent, tokens. ARGV: request id, tokens used, tpm (0: none).
FINISH = _BUCKET + """
redis.call('ZREM', KEYS[1], ARGV[1])
local tpm = tonumber(ARGV[3])
if tpm > 0 then store(KEYS[2], level_of(KEYS[2], tpm, now) - tonumber(ARGV[2]), tpm, now) end
return 1
"""


@dataclass
class OverLimit(Exception):
    """A request refused for its tenant's limit."""

    tenant: str
    limit: str                                  # "max_concurrent", "requests_per_minute", "tokens_per_minute"
    retry_after_s: float
    headers: dict[str, str] = field(default_factory=dict)   # OpenAI's x-ratelimit-* (and retry-after)

    def __str__(self) -> str:
        return f"tenant {self.tenant!r} is over its {self.limit} limit: retry after {self.retry_after_s:.1f} s"


def _reset(level: float, per_minute: int) -> str:
    return f"{max(0.0, (per_minute - level) * 60 / per_minute):.3f}s"


def rate_limit_headers(tenant: Tenant, requests: float, tokens: float,
                       retry_after_s: float | None = None) -> dict[str, str]:
    """OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the limits `tenant` has; with
    `retry_after_s` (a refusal) `retry-after` too (whole seconds, >= 1), and `x-ratelimit-limit-concurrent`."""
    headers = {}
    if retry_after_s is not None:
        headers[RETRY_AFTER_KEY] = str(max(1, math.ceil(retry_after_s)))
    for kind, per_minute, level in (("requests", tenant.requests_per_minute, requests),
                                    ("tokens", tenant.tokens_per_minute, tokens)):
        if per_minute:
            headers[f"{RATE_LIMIT_PREFIX}limit-{kind}"] = str(per_minute)
            headers[f"{RATE_LIMIT_PREFIX}remaining-{kind}"] = str(max(0, math.floor(level)))
            headers[f"{RATE_LIMIT_PREFIX}reset-{kind}"] = _reset(level, per_minute)
    if tenant.max_concurrent and retry_after_s is not None:
        headers[f"{RATE_LIMIT_PREFIX}limit-concurrent"] = str(tenant.max_concurrent)
    return headers


class _LocalCounters:
    """The same three rules in this process's memory: while Redis has been unreachable too long."""

    def __init__(self) -> None:
        self.running: dict[str, set[str]] = {}
        self.buckets: dict[tuple[str, str], tuple[float, float]] = {}

    def _level(self, key: tuple[str, str], per_minute: int, now: float) -> float:
        level, at = self.buckets.get(key, (per_minute, now))
        return min(per_minute, level + max(0.0, now - at) * per_minute / 60)

    def admit(self, tenant: Tenant, request_id: str) -> tuple[str, float, float, float]:
        now, over, retry = time.monotonic(), "", 0.0
        requests = tokens = -1.0
        if tenant.max_concurrent and len(self.running.get(tenant.name, ())) >= tenant.max_concurrent:
            over, retry = "max_concurrent", 1.0
        if tenant.requests_per_minute:
            requests = self._level((tenant.name, "requests"), tenant.requests_per_minute, now)
            if requests < 1 and not over:
                over, retry = "requests_per_minute", (1 - requests) * 60 / tenant.requests_per_minute
        if tenant.tokens_per_minute:
            tokens = self._level((tenant.name, "tokens"), tenant.tokens_per_minute, now)
            if tokens <= 0 and not over:
                over, retry = "tokens_per_minute", (1 - tokens) * 60 / tenant.tokens_per_minute
        if not over:
            if tenant.max_concurrent:
                self.running.setdefault(tenant.name, set()).add(request_id)
            if tenant.requests_per_minute:
                requests -= 1
                self.buckets[(tenant.name, "requests")] = (requests, now)
        return over, retry, requests, tokens

    def finish(self, tenant: Tenant, request_id: str, tokens: int) -> None:
        self.running.get(tenant.name, set()).discard(request_id)
        if tenant.tokens_per_minute:
            now = time.monotonic()
            key = (tenant.name, "tokens")
            self.buckets[key] = (self._level(key, tenant.tokens_per_minute, now) - tokens, now)


@dataclass
class Admission:
    """A request let in; `tokens` (prompt + generated) is charged when it ends."""

    tenant: Tenant
    request_id: str
    tokens: int = 0
    local: bool = False       # admitted by the in-memory counters (release there)
    answered: bool = False
    headers: dict[str, str] = field(default_factory=dict)   # x-ratelimit-* at admission (none: not limited)
    ended: bool = False       # `finish`ed: its slot freed, its tokens charged (once)


class TenantLimits:
    """Admits requests against their tenant's limits (Redis, else fail-open, else in memory)."""

    def __init__(self, redis_url: str, registry: CollectorRegistry | None = None,
                 fail_open_s: float = FAIL_OPEN_S, clock=time.monotonic, lease_s: float | None = None) -> None:
        self.redis = redis_client(redis_url, timeout_s=REDIS_TIMEOUT_S)   # a Sentinel URL too (redis_url.py)
        self._admit = self.redis.register_script(ADMIT)
        self._renew = self.redis.register_script(RENEW)
        self._finish = self.redis.register_script(FINISH)
        self.lease_s = LEASE_S if lease_s is None else lease_s
        self.fail_open_s, self.clock = fail_open_s, clock
        self.unreachable_since: float | None = None
        self.local = _LocalCounters()
        self.unenforced = Counter("streamrag_tenant_limits_unenforced",
                                  "Requests let in without checking their tenant's limits in Redis "
                                  "(unreachable), by how: open or local", ["tenant", "how"], registry=registry)

    async def close(self) -> None:
        await self.redis.aclose()

    @staticmethod
    def keys(tenant: Tenant) -> tuple[str, str, str]:
        base = f"{PREFIX}{tenant.name}:"
        return base + "concurrent", base + "requests", base + "tokens"

    def _unreachable(self, exc: Exception) -> bool:
        """Note an outage; True while it is short enough to fail open."""
        now = self.clock()
        if self.unreachable_since is None:
            self.unreachable_since = now
            log.warning("tenant limits: Redis unreachable (%s); limits fail open for %.0f s, then hold per "
                        "orchestrator", exc, self.fail_open_s)
        return now - self.unreachable_since < self.fail_open_s

    def _reachable(self) -> None:
        if self.unreachable_since is not None:
            log.warning("tenant limits: Redis reachable again; limits hold across the fleet")
            self.unreachable_since = None

    async def admit(self, tenant: Tenant, request_id: str, resumed: bool = False) -> Admission:
        """Let `request_id` in for `tenant` or raise `OverLimit`. `resumed`: an Ask resumed after its
        orchestrator died: still in flight (in `concurrent`), it keeps its slot and takes no new request;
        otherwise (it ended, or its lease did) it is checked like a new request."""
        if not tenant.limited:
            return Admission(tenant, request_id)
        args = (request_id, tenant.max_concurrent or 0, tenant.requests_per_minute or 0,
                tenant.tokens_per_minute or 0, self.lease_s, int(resumed))
        local = False
        try:
            over, retry, requests, tokens, _ = await self._admit(keys=list(self.keys(tenant)), args=list(args))
            self._reachable()
            over, retry, requests, tokens = over.decode() if isinstance(over, bytes) else over, float(retry), \
                float(requests), float(tokens)
        except (RedisError, OSError) as exc:
            if self._unreachable(exc):
                self.unenforced.labels(tenant.name, "open").inc()
                return Admission(tenant, request_id)
            self.unenforced.labels(tenant.name, "local").inc()
            over, retry, requests, tokens = self.local.admit(tenant, request_id)
            local = True
        if over:
            raise OverLimit(tenant.name, over, retry, rate_limit_headers(tenant, requests, tokens, retry))
        return Admission(tenant, request_id, local=local, headers=rate_limit_headers(tenant, requests, tokens))

    async def renew(self, admission: Admission) -> bool:
        """Extend the lease of the request's slot (the heartbeat of a request that runs); False when it
        held none any more (its lease had ended). Nothing to do without a `max_concurrent`, or in memory."""
        tenant = admission.tenant
        if not tenant.max_concurrent or admission.local:
            return True
        try:
            held = await self._renew(keys=[self.keys(tenant)[0]], args=[admission.request_id, self.lease_s])
        except (RedisError, OSError):
            return True                 # kept by its lease (or freed with it) until Redis answers again
        return bool(held)

    async def finish(self, admission: Admission) -> None:
        """The request ended: free its slot and charge its tokens (once; a second call does nothing)."""
        tenant = admission.tenant
        if not tenant.limited or admission.ended:
            return
        admission.ended = True
        if admission.local:
            self.local.finish(tenant, admission.request_id, admission.tokens)
            return
        concurrent, _, tokens_key = self.keys(tenant)
        try:
            await self._finish(keys=[concurrent, tokens_key],
                               args=[admission.request_id, admission.tokens, tenant.tokens_per_minute or 0])
            self._reachable()
        except (RedisError, OSError) as exc:
            if not self._unreachable(exc):
                self.local.finish(tenant, admission.request_id, admission.tokens)

    @asynccontextmanager
    async def admitted(self, tenant: Tenant, request_id: str) -> AsyncIterator[Admission]:
        """`admit`, then `finish` however the request ends."""
        admission = await self.admit(tenant, request_id)
        try:
            yield admission
        finally:
            await self.finish(admission)


async def refuse(context: grpc.aio.ServicerContext, over: OverLimit) -> None:
    """End the call RESOURCE_EXHAUSTED, with the retry delay and rate-limit values in trailing metadata."""
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(over), trailing_metadata=tuple(over.headers.items()))

