"""One resume at a time per request: a claim in Redis that the orchestrator resuming it holds.

A caller whose Ask (or plain call) broke re-issues it as a resume (servicekit/ask_resume.py). Two
callers resuming the same request at once (two gateways, a client and a retry) would both continue
its stored prompt. The first to claim `streamrag:resume:<request id>` (`SET NX`, with a lease of
`LEASE_S`, servicekit/tenants.py) runs it; the second is told ABORTED, "already being resumed" (`AlreadyResumed`).
The orchestrator renews its claim while the resume runs (admission.py's heartbeat, with the
tenant's slot) and deletes it when the resume ends; a claim of an orchestrator that died ends with
its lease, so the request can be resumed again.

The first Ask takes no claim: its orchestrator may die without a word, and the caller's resume must
not wait out a lease for it. With Redis unreachable a resume goes on unclaimed (logged): it fails
open, like the limits.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from redis.exceptions import RedisError

from servicekit.redis_url import redis_client

log = logging.getLogger(__name__)

PREFIX = "streamrag:resume:"
REDIS_TIMEOUT_S = 0.5
# KEYS: the claim. ARGV: the holder's token, the lease in ms. 1 when still held (and renewed), else 0.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: the claim. ARGV: the holder's token. Deletes it only if still the holder's.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class AlreadyResumed(Exception):
    """Another caller's resume of the request is running (ABORTED)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"request {request_id!r} is already being resumed: only one resume of a request runs "
                         f"at a time")


@dataclass(frozen=True)
class Claim:
    request_id: str
    token: str = ""           # "": not held in Redis (unreachable: failed open)

    @property
    def key(self) -> str:
        return PREFIX + self.request_id


class ResumeClaims:
    """Claims on requests being resumed, in the Redis at `redis_url`."""

    def __init__(self, redis_url: str, lease_s: float) -> None:
        self.redis = redis_client(redis_url, timeout_s=REDIS_TIMEOUT_S)
        self.lease_ms = max(1, round(lease_s * 1000))
        self._renew = self.redis.register_script(RENEW)
        self._release = self.redis.register_script(RELEASE)

    async def close(self) -> None:
        await self.redis.aclose()

    async def claim(self, request_id: str) -> Claim:
        """The claim on `request_id`'s resume, or `AlreadyResumed` while another holds it."""
        claim = Claim(request_id, uuid.uuid4().hex)
        try:
            taken = await self.redis.set(claim.key, claim.token, nx=True, px=self.lease_ms)
        except (RedisError, OSError) as exc:
            log.warning("resume of %s not claimed (Redis unreachable: %s): it goes on unclaimed", request_id, exc)
            return Claim(request_id)
        if not taken:
            raise AlreadyResumed(request_id)
        return claim

    async def renew(self, claim: Claim) -> bool:
        """Extend the claim by a lease; False when it was no longer held (its lease ended)."""
        if not claim.token:
            return True
        try:
            return bool(await self._renew(keys=[claim.key], args=[claim.token, self.lease_ms]))
        except (RedisError, OSError):
            return True               # kept by its lease until Redis answers again

    async def release(self, claim: Claim) -> None:
        if not claim.token:
            return
        try:
            await self._release(keys=[claim.key], args=[claim.token])
        except (RedisError, OSError) as exc:
            log.warning("resume claim of %s not released (Redis unreachable: %s): it ends with its lease",
                        claim.request_id, exc)
