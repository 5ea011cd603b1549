"""Moving a request off a replica that failed under it: choose another, log it, record it.

Every caller (an Ask, before or after its first token; a plain `Generate` through the Inference
proxy) moves the same way, so a newcomer reads the rule once:

- the failed replica is marked failed in the router (skipped until its health says SERVING again);
- another available replica is chosen first; with none, the first replica that is (back) within
  the wait (`failures.peer_wait_s`, never past the caller's deadline), the failed one too;
- the move is logged and, when the request is in the store, recorded (`recording.record_moved`): an
  ERROR event naming both replicas (and how many tokens the new one continues from, for a resume)
  and the record's replica.

Which statuses move a request, and how often, is failures.py's; what the new replica is sent is
the caller's (the prompt so far before the first token; resume.py's continuation after it).
"""

from __future__ import annotations

import logging

import grpc

from orchestrator.failures import peer_wait_s
from orchestrator.lifecycle_store import LifecycleStore
from orchestrator.recording import record_moved
from orchestrator.router import NoReplicaAvailable, Replica, ReplicaRouter

log = logging.getLogger(__name__)


async def fail_over(router: ReplicaRouter, store: LifecycleStore | None, request_id: str, failed: Replica,
                    prefix_key: str, exc: grpc.RpcError, time_remaining: float | None, *,
                    resumed_tokens: int | None = None) -> Replica:
    """The replica that takes the request over from `failed`; raises `NoReplicaAvailable` when none is
    (back) within the wait. `store` None: the request is not recorded yet, so only the log says it."""
    reason = f"{exc.code().name}: {exc.details()}"
    router.mark_failed(failed.address, reason)
    try:
        chosen = router.choose(prefix_key, exclude={failed.address})
    except NoReplicaAvailable:
        chosen = await router.choose_ready(prefix_key, wait_s=peer_wait_s(time_remaining))
    how = "retrying" if resumed_tokens is None else f"continuing after {resumed_tokens} tokens"
    log.warning("%s: replica %s failed (%s); %s on %s", request_id, failed.address, reason, how, chosen.address)
    if store is not None:
        await record_moved(store, request_id, failed.address, chosen.address, exc.details(), how)
    return chosen
