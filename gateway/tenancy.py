"""Who a request is for, and how urgent it is, as the call metadata the orchestrator reads.

The tenant is the one the caller's key belongs to (servicekit/tenants.py; `RequireApiKey` puts it
in the request's state). The priority is the body's `priority` field (as vLLM's OpenAI server takes
it) or else the `x-request-priority` header: an integer, lower runs sooner, default 0; it orders
requests within their tenant only (a tenant's share of the replicas does not change with it).
A header that is not an integer is a 400, as the body field is (gateway/protocol.py).
"""

from __future__ import annotations

from fastapi import Request
from starlette.types import Scope

from gateway.errors import GatewayError
from servicekit.tenants import NO_TENANT, Tenant

PRIORITY_HEADER = "x-request-priority"
PRIORITY_RANGE = (-(2**31), 2**31 - 1)           # the proto's int32


def tenant_of(scope: Scope) -> Tenant:
    """The tenant `RequireApiKey` found for this request's key (`NO_TENANT` on an open gateway)."""
    return (scope.get("state") or {}).get("tenant", NO_TENANT)


def set_tenant(scope: Scope, tenant: Tenant) -> None:
    scope.setdefault("state", {})["tenant"] = tenant


def request_priority(request: Request, body_priority: int | None) -> int:
    """The body's priority, else the header's, else 0; a header that is not an int32 is a 400."""
    if body_priority is not None:
        return body_priority
    raw = request.headers.get(PRIORITY_HEADER)
    if raw is None:
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        raise GatewayError(400, f"{PRIORITY_HEADER}: must be an integer, got {raw!r}", param=PRIORITY_HEADER,
                           code="invalid_priority") from None
    if not PRIORITY_RANGE[0] <= value <= PRIORITY_RANGE[1]:
        raise GatewayError(400, f"{PRIORITY_HEADER}: out of range, got {value}", param=PRIORITY_HEADER,
                           code="invalid_priority")
    return value

