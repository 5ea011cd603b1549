"""Who a call is for: its tenant and priority, read once from the call's metadata, and sent on to
the replica with every call made while serving it.

The tenant is the one the caller's key belongs to (servicekit/tenants.py); a caller with the
stack's own key (the gateway) may name the tenant it acts for (`protos.metadata.TENANT_KEY`). The
priority is `PRIORITY_KEY` (an integer; lower runs sooner), 0 when absent; anything else is the
caller's error (`BadIdentity`).

Who may read which request records (GetRequest, ListRequests) and reach which sessions (every Sessions
call): `reader_scope` and `may_read`, the one rule for both. A tenant's key reads its tenant's records
and sessions only; an `admin` tenant's key, the stack's own key in a call naming no tenant (the
operator: `streamrag requests`, `streamrag session`), or any call on a service with no keys, reads
every tenant's. What another tenant owns answers as if it did not exist (ids do not leak).

`current_identity` holds the identity of the request being served (a context variable: the tasks an
Ask starts inherit it), and `identity_interceptors` add it to every call on the replica channels, so
the Ask pipeline, the Inference proxy and sessions need no change to send it.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import grpc

from protos.metadata import PRIORITY_KEY, TENANT_KEY, identity_metadata
from servicekit.auth import bearer_token
from servicekit.tenants import NO_TENANT, Tenant, Tenants

PRIORITY_RANGE = (-(2**31), 2**31 - 1)


class BadIdentity(ValueError):
    """The call's metadata names a priority that is not an integer (INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class CallIdentity:
    tenant: Tenant = NO_TENANT
    priority: int = 0

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What the replica reads (inference_svc/rpc/tenancy.py)."""
        return identity_metadata(self.tenant.name, self.tenant.weight, self.priority)


current_identity: ContextVar[CallIdentity | None] = ContextVar("current_identity", default=None)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def identity_of(metadata, tenants: Tenants) -> CallIdentity:
    """The identity of a call with `metadata` (its invocation metadata)."""
    found = {key: _text(value) for key, value in metadata or ()}
    tenant = tenants.resolve(bearer_token(found.get("authorization")), found.get(TENANT_KEY))
    raw = found.get(PRIORITY_KEY)
    if raw is None:
        return CallIdentity(tenant)
    try:
        priority = int(raw.strip())
    except ValueError:
        raise BadIdentity(f"{PRIORITY_KEY} must be an integer, got {raw!r}") from None
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise BadIdentity(f"{PRIORITY_KEY} is out of range, got {priority}")
    return CallIdentity(tenant, priority)


def reader_scope(metadata, tenants: Tenants) -> str | None:
    """The tenant whose request records a call with `metadata` may read; None: every tenant's."""
    found = {key: _text(value) for key, value in metadata or ()}
    tenant = tenants.resolve(bearer_token(found.get("authorization")), found.get(TENANT_KEY))
    if tenant.admin or (tenant is NO_TENANT and not tenants):
        return None
    if tenant.own and TENANT_KEY not in found:
        return None
    return tenant.name


def may_read(scope: str | None, owner: str) -> bool:
    """Whether a caller of `scope` (`reader_scope`) may read what tenant `owner` owns ("": no tenant's,
    as records and sessions from before tenants are)."""
    return scope is None or owner == scope


def owner_identity(tenants: Tenants, owner: str, caller: CallIdentity | None) -> CallIdentity:
    """The identity of calls made for tenant `owner`'s sake (a session's rebuild, whoever's call found its
    replica lost): the owner's tenant as the tenants file has it, at the caller's priority."""
    tenant = tenants.named(owner) or (NO_TENANT if not owner else Tenant(owner))
    return CallIdentity(tenant, caller.priority if caller is not None else 0)


class _WithIdentity:
    def _with_identity(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        identity = current_identity.get()
        if identity is None:
            return details
        extra = identity.metadata()
        if not extra:
            return details
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *extra)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                          details.wait_for_ready)


class _UnaryUnary(_WithIdentity, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._with_identity(details), request)


class _UnaryStream(_WithIdentity, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._with_identity(details), request)


class _StreamUnary(_WithIdentity, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, requests):
        return await continuation(self._with_identity(details), requests)


class _StreamStream(_WithIdentity, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, requests):
        return await continuation(self._with_identity(details), requests)


def identity_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors adding `current_identity`'s metadata to every call of a channel."""
    return [kind() for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]
