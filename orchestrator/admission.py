"""What every request the orchestrator serves passes (an Ask, a plain Generate, a StreamPrompt):

1. who it is for (tenancy.py): a priority that is not an integer ends the call INVALID_ARGUMENT;
2. its tenant's limits (limits.py): over one, RESOURCE_EXHAUSTED with the retry delay; admitted, the
   call's initial metadata carries OpenAI's `x-ratelimit-*` values at admission (a tenant with a
   per-minute limit: the gateway sets them on its answer's headers);
3. its tenant's `max_queue_s` (default 60 s): a request whose answer has not started by then (no
   token yet) is shed, UNAVAILABLE with `retry-after` in the trailing metadata, its replica call
   cancelled (which frees its blocks) and its record FAILED; so every request answers or is refused
   within `max_queue_s` (plus `PREFILL_GRACE_S`, below), never left to hang until the client's own
   timeout. A request whose answer is streaming is never shed. One the replica has already scheduled
   (its prefill has begun: the engine's SCHEDULED event) gets `PREFILL_GRACE_S` more for its first
   token before it is shed: shedding a prefill half done throws its work away, and under a queue
   close to `max_queue_s` that waste is what pushes the next requests past it.

`TenantGate.serve` wraps a servicer's response stream in all three, charges the tenant's tokens
when the answer is done, and counts per tenant: requests by outcome, tokens, first-token times and
refusals (metrics.py).

A resume (a caller's re-issue of a request whose orchestrator died) is the tenant's that asked it
(PERMISSION_DENIED otherwise), and only one resume of a request runs at a time: the first claims it
in Redis (resume_claims.py), any other ends ABORTED, "already being resumed". While a request runs, a
heartbeat renews its tenant's slot and its resume's claim every `LEASE_S / RENEWALS_PER_LEASE`, so
both end within a lease of an orchestrator that died.

The orchestrator is saturated while it has shed a request in the last `SATURATED_S`, or while every
replica it reaches is overloaded (`saturation()`): its metrics say so
(`streamrag_orchestrator_saturated{reason}`, metrics.py), and `streamrag status` shows it on the
orchestrator's line, as the gateway's /health does for the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc

from orchestrator.lifecycle_records import StoreUnavailable
from orchestrator.limits import LEASE_S, Admission, OverLimit, TenantLimits, refuse
from orchestrator.recording import record_failed, record_tenant
from orchestrator.resume_claims import AlreadyResumed, Claim, ResumeClaims
from orchestrator.tenancy import BadIdentity, current_identity, identity_of
from protos import common_pb2
from protos.metadata import RETRY_AFTER_KEY
from servicekit.tenants import Tenants

log = logging.getLogger(__name__)

SATURATED_S = 60.0
RENEWALS_PER_LEASE = 3      # heartbeats of a running request per lease: two may be missed before it ends
PREFILL_GRACE_S = 4.0         # within the "max_queue_s plus 5 s" a client may wait for an answer or a refusal
_SCHEDULED = common_pb2.LIFECYCLE_EVENT_KIND_SCHEDULED


def shed_retry_after_s(max_queue_s: float) -> int:
    """The retry delay a shed request is told: half its wait, between 1 and 30 s."""
    return max(1, min(30, math.ceil(max_queue_s / 2)))


def _started(event) -> bool:
    """The answer has started: its first token (or its end)."""
    return event.WhichOneof("kind") in ("token", "done")


def _scheduled(event) -> bool:
    """The replica has scheduled the request: its prefill has begun."""
    return event.WhichOneof("kind") == "lifecycle" and event.lifecycle.kind == _SCHEDULED


class TenantGate:
    """Identity, limits, queue deadline and per-tenant counts for every request the orchestrator serves."""

    def __init__(self, tenants: Tenants, limits: TenantLimits | None, metrics, store=None,
                 clock: Callable[[], float] = time.monotonic, claims: ResumeClaims | None = None,
                 lease_s: float = LEASE_S, prefill_grace_s: float = PREFILL_GRACE_S) -> None:
        self.tenants, self.limits, self.metrics, self.store, self.clock = tenants, limits, metrics, store, clock
        self.claims, self.lease_s, self.prefill_grace_s = claims, lease_s, prefill_grace_s
        self.last_shed: float | None = None

    def saturated(self) -> bool:
        return self.last_shed is not None and self.clock() - self.last_shed < SATURATED_S

    def saturation(self, router=None) -> dict:
        """Whether the orchestrator is saturated and why: it shed a request in the last `SATURATED_S`
        (`shedding`), or every replica `router` reaches is overloaded (`replicas_overloaded`: the router
        has no replica with room left); and seconds since the last request shed (None: none yet)."""
        since = None if self.last_shed is None else self.clock() - self.last_shed
        shedding = since is not None and since < SATURATED_S
        try:
            scores = router.scores("") if router is not None else {}
        except RuntimeError:          # read from the metrics thread while the loop changed the replicas
            scores = {}
        overloaded = bool(scores) and all(score.overloaded for score in scores.values())
        return {"saturated": shedding or overloaded, "shedding": shedding, "replicas_overloaded": overloaded,
                "last_shed_s_ago": None if since is None else round(since, 1)}

    @asynccontextmanager
    async def admitted(self, context: grpc.aio.ServicerContext, request_id: str,
                       resumed: bool = False) -> AsyncIterator[Admission]:
        """The call's admission (the request's identity goes with every replica call made inside); a bad
        priority ends the call INVALID_ARGUMENT, a resume of another tenant's request PERMISSION_DENIED, a
        second resume of one ABORTED, a limit RESOURCE_EXHAUSTED (`refuse`)."""
        try:
            identity = identity_of(context.invocation_metadata(), self.tenants)
        except BadIdentity as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        name = identity.tenant.name
        if resumed and request_id and await self._owner(request_id) not in (None, "", name):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"request {request_id!r} is another tenant's: "
                                f"only the tenant that asked it may resume it")
        claim = None
        if resumed and request_id and self.claims is not None:
            try:
                claim = await self.claims.claim(request_id)
            except AlreadyResumed as exc:
                self.metrics.tenant_rejections.labels(name, "already_resumed").inc()
                log.info("%s", exc)
                await context.abort(grpc.StatusCode.ABORTED, str(exc))
        try:
            async with self._limited(context, identity, request_id, resumed, claim) as admission:
                yield admission
        finally:
            if claim is not None:
                await self.claims.release(claim)

    async def let_in(self, context: grpc.aio.ServicerContext) -> None:
        """A call that holds no slot while it runs (a session's Subscribe): admitted like any (its identity set
        for the replica calls it makes, one of its tenant's requests taken), its slot freed at once."""
        async with self.admitted(context, "") as admission:
            admission.answered = True

    @asynccontextmanager
    async def _limited(self, context: grpc.aio.ServicerContext, identity, request_id: str, resumed: bool,
                       claim: Claim | None) -> AsyncIterator[Admission]:
        name = identity.tenant.name
        try:
            admission = (await self.limits.admit(identity.tenant, request_id or uuid.uuid4().hex, resumed)
                         if self.limits is not None else Admission(identity.tenant, request_id))
        except OverLimit as over:
            self.metrics.tenant_rejections.labels(name, over.limit).inc()
            log.info("%s", over)
            await refuse(context, over)
        current_identity.set(identity)        # this call's task alone: never reset (an RPC runs in its own task)
        if self.store is not None and request_id:
            await record_tenant(self.store, request_id, name, identity.priority)
        if admission.headers:                 # the limits' values at admission, before the answer (the gateway's
            await context.send_initial_metadata(tuple(admission.headers.items()))   # headers of a success)
        outcome = "cancelled"
        renews_slot = self.limits is not None and bool(admission.tenant.max_concurrent) and not admission.local
        heartbeat = (asyncio.create_task(self._heartbeat(admission, claim, renews_slot))
                     if renews_slot or (claim is not None and claim.token) else None)
        try:
            yield admission
            outcome = "answered" if admission.answered else outcome
        except BaseException:
            outcome = "failed"
            raise
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)
            self.metrics.tenant_requests.labels(name, outcome).inc()
            if self.limits is not None:
                await self.limits.finish(admission)

    async def _heartbeat(self, admission: Admission, claim: Claim | None, renews_slot: bool) -> None:
        """Renew the request's slot and its resume's claim while it runs (each ends a lease after the last
        renewal: within a lease of its orchestrator's death)."""
        lapsed = False
        while True:
            await asyncio.sleep(self.lease_s / RENEWALS_PER_LEASE)
            if admission.ended:
                return
            if renews_slot and not await self.limits.renew(admission) and not lapsed:
                lapsed = True
                log.warning("request %s of tenant %r: its slot's lease ended before it was renewed (this "
                            "orchestrator stalled, or Redis was out): it no longer counts against max_concurrent",
                            admission.request_id, admission.tenant.name)
            if claim is not None and claim.token:
                await self.claims.renew(claim)

    async def _owner(self, request_id: str) -> str | None:
        """The tenant recorded for `request_id` ("" before tenants; None when unknown or unreadable)."""
        if self.store is None:
            return None
        try:
            stored = await self.store.get(request_id)
        except StoreUnavailable:
            return None
        return stored.extra.get("tenant", "") if stored is not None else None

    async def serve(self, context: grpc.aio.ServicerContext, request_id: str, responses: AsyncIterator,
                    event_of: Callable[[Any], Any], resumed: bool = False) -> AsyncIterator:
        """`responses` (a servicer's stream; `event_of(response)`: its AskEvent or InferenceEvent) behind the
        gate: admitted, shed if it has not started within its tenant's `max_queue_s`, charged when done.
        `resumed`: an Ask resumed from a dead orchestrator (limits.py: admitted as the same request)."""
        async with self.admitted(context, request_id, resumed) as admission, contextlib.aclosing(responses):
            wait_s = admission.tenant.max_queue_s
            deadline = self.clock() + wait_s
            started = scheduled = False
            while True:
                try:
                    if started:
                        response = await anext(responses)
                    else:
                        response = await asyncio.wait_for(anext(responses), max(0.0, deadline - self.clock()))
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    await self._shed(context, admission, wait_s)
                event = event_of(response)
                started = started or _started(event)
                if not scheduled and _scheduled(event):
                    scheduled, deadline = True, deadline + self.prefill_grace_s
                if event.WhichOneof("kind") == "done":
                    stats = event.done.stats
                    self.note_done(admission, stats, getattr(event.done, "ttft_from_question_s", 0.0)
                                   or stats.ttft_from_open_s)
                    if self.limits is not None:     # freed before the caller has the answer: its next request
                        await self.limits.finish(admission)   # finds the slot free
                yield response

    async def _shed(self, context: grpc.aio.ServicerContext, admission: Admission, wait_s: float) -> None:
        """The request did not start within `wait_s`: FAILED, and the call ends UNAVAILABLE with a retry delay."""
        self.last_shed = self.clock()
        name = admission.tenant.name
        self.metrics.tenant_rejections.labels(name, "queue_timeout").inc()
        message = (f"not started within {wait_s:g} s (the tenant's max_queue_s): the service is saturated; "
                   f"retry later")
        log.info("request %s of tenant %r shed: %s", admission.request_id, name, message)
        if self.store is not None and admission.request_id:
            await record_failed(self.store, admission.request_id, message)
        await context.abort(grpc.StatusCode.UNAVAILABLE, message,
                            trailing_metadata=((RETRY_AFTER_KEY, str(shed_retry_after_s(wait_s))),))

    def note_done(self, admission: Admission, stats, ttft_s: float) -> None:
        """The request's answer is complete: charge its tokens, count them and its first-token time."""
        admission.answered = True
        admission.tokens = stats.prompt_tokens + stats.generated_tokens
        name = admission.tenant.name
        self.metrics.tenant_tokens.labels(name, "prompt").inc(stats.prompt_tokens)
        self.metrics.tenant_tokens.labels(name, "generated").inc(stats.generated_tokens)
        self.metrics.tenant_ttft.labels(name).observe(ttft_s)
