"""The limits' bookkeeping in Redis (orchestrator/limits.py), without a model: two orchestrators share one
limit, a running request's lease is renewed and a dead orchestrator's slots come back when their leases end,
one resume of a request at a time (resume_claims.py), and Redis unreachable fails open, then holds the
limits in memory after the bound."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.limits import OverLimit, TenantLimits
from orchestrator.resume_claims import AlreadyResumed, ResumeClaims
from servicekit.tenants import Tenant
from tests.support.redis_server import free_port


@pytest.fixture
async def two(redis_server):
    first, second = TenantLimits(redis_server.url), TenantLimits(redis_server.url)
    yield first, second
    await first.close()
    await second.close()


async def test_two_orchestrators_enforce_one_requests_per_minute_limit(two):
    tenant = Tenant("shared", requests_per_minute=5)
    admitted = refused = 0
    for i in range(10):
        try:
            await two[i % 2].admit(tenant, f"r{i}")
            admitted += 1
        except OverLimit as over:
            refused += 1
            assert over.limit == "requests_per_minute" and over.retry_after_s > 0
            assert over.headers["x-ratelimit-remaining-requests"] == "0"
    assert (admitted, refused) == (5, 5)


async def test_max_concurrent_counts_requests_in_flight_across_orchestrators(two):
    tenant = Tenant("pair", max_concurrent=2)
    a = await two[0].admit(tenant, "a")
    await two[1].admit(tenant, "b")
    with pytest.raises(OverLimit, match="max_concurrent"):
        await two[0].admit(tenant, "c")
    await two[0].finish(a)
    await two[1].admit(tenant, "c")
    other = Tenant("independent", max_concurrent=1)
    await two[0].admit(other, "x")                       # another tenant's counter is its own


async def test_a_dead_orchestrators_slots_free_when_their_leases_end(two):
    tenant = Tenant("leased", max_concurrent=1)
    two[0].lease_s = 0                                    # leases end at once: as a lease after its last renewal
    await two[0].admit(tenant, "held-by-the-dead")        # never finished nor renewed: its orchestrator was killed
    await two[1].admit(tenant, "next")


async def test_a_running_requests_lease_is_renewed_until_it_ends(two):
    tenant = Tenant("renewed", max_concurrent=1)
    concurrent = TenantLimits.keys(tenant)[0]
    admission = await two[0].admit(tenant, "running")
    first = await two[0].redis.zscore(concurrent, "running")
    assert await two[0].renew(admission)
    assert await two[0].redis.zscore(concurrent, "running") > first      # its lease now ends later
    await two[0].finish(admission)
    assert not await two[0].renew(admission)                               # ended: nothing to renew, none re-taken
    assert await two[0].redis.zscore(concurrent, "running") is None


async def test_one_resume_of_a_request_runs_at_a_time(redis_server):
    first, second = ResumeClaims(redis_server.url, lease_s=30), ResumeClaims(redis_server.url, lease_s=30)
    try:
        claim = await first.claim("resumed-twice")
        with pytest.raises(AlreadyResumed, match="already being resumed"):
            await second.claim("resumed-twice")
        assert await first.renew(claim)
        await second.claim("another-request")             # a claim is per request
        await first.release(claim)
        again = await second.claim("resumed-twice")       # the first resume ended: it may be resumed again
        await first.release(claim)                         # a stale release leaves the new holder's claim alone
        with pytest.raises(AlreadyResumed):
            await first.claim("resumed-twice")
        await second.release(again)
        short = ResumeClaims(redis_server.url, lease_s=0.001)   # a claim whose holder died ends with its lease
        await short.claim("holder-died")
        try:
            while True:
                try:
                    await first.claim("holder-died")
                    break
                except AlreadyResumed:
                    await asyncio.sleep(0.01)
        finally:
            await short.close()
    finally:
        await first.close()
        await second.close()


async def test_tokens_are_charged_when_a_request_ends_and_hold_the_next_one_back(two):
    tenant = Tenant("tokens", tokens_per_minute=100)
    admission = await two[0].admit(tenant, "big")
    admission.tokens = 150
    await two[0].finish(admission)
    with pytest.raises(OverLimit) as raised:
        await two[1].admit(tenant, "next")
    assert raised.value.limit == "tokens_per_minute" and raised.value.retry_after_s > 25   # 50 tokens in debt
    assert raised.value.headers["x-ratelimit-limit-tokens"] == "100"


async def test_redis_unreachable_fails_open_for_a_bounded_time_then_holds_limits_in_memory():
    now = [0.0]
    limits = TenantLimits(f"redis://127.0.0.1:{free_port()}/0", fail_open_s=60, clock=lambda: now[0])
    tenant = Tenant("outage", requests_per_minute=1)
    try:
        for i in range(3):                                 # open: every request goes on, counted
            await limits.admit(tenant, f"open-{i}")
        assert limits.unenforced.labels("outage", "open")._value.get() == 3
        now[0] = 61.0                                      # past the bound: this orchestrator's own counters
        await limits.admit(tenant, "local-1")
        with pytest.raises(OverLimit):
            await limits.admit(tenant, "local-2")
        assert limits.unenforced.labels("outage", "local")._value.get() == 2
    finally:
        await limits.close()


async def test_an_ask_resumed_after_its_orchestrator_died_keeps_its_slot_and_takes_no_new_request(two):
    tenant = Tenant("resumed", max_concurrent=1, requests_per_minute=2)
    await two[0].admit(tenant, "ask-1")              # then its orchestrator is killed: the slot stays in Redis
    with pytest.raises(OverLimit, match="max_concurrent"):
        await two[1].admit(tenant, "ask-2")          # the limit still holds on the orchestrator that lives
    resumed = await two[1].admit(tenant, "ask-1", resumed=True)
    await two[1].finish(resumed)
    await two[1].admit(tenant, "ask-2")              # the second of its two requests a minute


async def test_a_resume_of_an_ask_that_ended_is_checked_like_a_new_request(two):
    tenant = Tenant("ended", max_concurrent=1, requests_per_minute=2)
    done = await two[0].admit(tenant, "ask-1")
    await two[0].finish(done)                        # it ended: no slot of its own left to keep
    await two[0].admit(tenant, "ask-2")              # in flight: the tenant's one slot
    with pytest.raises(OverLimit, match="max_concurrent"):
        await two[1].admit(tenant, "ask-1", resumed=True)
    rpm_only = Tenant("ended-rpm", requests_per_minute=1)
    done = await two[0].admit(rpm_only, "ask-1")
    await two[0].finish(done)
    with pytest.raises(OverLimit, match="requests_per_minute"):
        await two[1].admit(rpm_only, "ask-1", resumed=True)
