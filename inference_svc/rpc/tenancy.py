"""Who a request is served for, read from the call's metadata (`protos.metadata`): its tenant and
the tenant's weight (a `fair_share.Share`), and its priority when the metadata names one (it then
overrides the message's `priority` field). Malformed values are the caller's error (`BadRequest`).

`CURRENT_SHARE` carries the share from the RPC to the backend's `_open` (a context variable, as
the decode target is: kv_transfer/decode_targets.py), so the backend hook keeps its signature.
"""

from __future__ import annotations

import math
from contextvars import ContextVar

from inference_svc.engine.fair_share import NO_SHARE, Share
from inference_svc.rpc.convert import BadRequest
from protos.metadata import PRIORITY_KEY, TENANT_KEY, TENANT_WEIGHT_KEY

CURRENT_SHARE: ContextVar[Share] = ContextVar("current_share", default=NO_SHARE)
MAX_TENANT_CHARS = 64


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def share_of(metadata) -> tuple[Share, int | None]:
    """(the request's share, its priority or None) from a call's invocation metadata."""
    found = {key: _text(value) for key, value in metadata or ()}
    tenant = found.get(TENANT_KEY, "")
    if len(tenant) > MAX_TENANT_CHARS or not tenant.isprintable():
        raise BadRequest(f"{TENANT_KEY} must be printable and at most {MAX_TENANT_CHARS} characters")
    try:
        weight = float(found.get(TENANT_WEIGHT_KEY, "1"))
    except ValueError:
        weight = math.nan
    if not (math.isfinite(weight) and weight > 0):
        raise BadRequest(f"{TENANT_WEIGHT_KEY} must be a positive number, got {found.get(TENANT_WEIGHT_KEY)!r}")
    priority = None
    if PRIORITY_KEY in found:
        try:
            priority = int(found[PRIORITY_KEY].strip())
        except ValueError:
            raise BadRequest(f"{PRIORITY_KEY} must be an integer, got {found[PRIORITY_KEY]!r}") from None
    return Share(tenant, weight), priority
