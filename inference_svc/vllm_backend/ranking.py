"""Our policies over vLLM's requests: the adapter the vLLM scheduler class ranks with.

The policies (`inference_svc/engine/policies.py`) read a handful of request attributes:
arrival, last chunk arrival, whether the context is complete, computed tokens, state,
admission order, preemption and passed-over times. `PolicyRanker` keeps one `PolicyView` per
vLLM request carrying exactly those, refreshes it from the vLLM request every step and asks
the policy for the order. Nothing here imports vllm: the scheduler class (`scheduler.py`)
hands in vLLM's `Request` objects and reads only duck-typed attributes, so the default test
suite exercises the adapter with plain objects.

What vLLM does not know, the backend's session code tells it (`stream_marks`): every turn's
`SamplingParams.extra_args` carries whether the context is complete after this turn (the
`finish` turn, or a whole prompt) and when the turn's chunk arrived (wall clock, the clock
of vLLM's own `arrival_time`). vLLM overwrites a session's `arrival_time` with each turn's, so
the first arrival is remembered here. A request's first submission also carries who it is for
(`share_marks`: tenant, weight, priority), kept in its view for fair share between tenants
(`make_policy(..., fair_share=True)`, engine/fair_share.py), which `charge` feeds with the tokens
vLLM scheduled for each request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inference_svc.engine.policies import Policy, PolicyContext, make_policy
from inference_svc.engine.request import RequestState

MARKS_KEY = "streamrag"          # the key of our marks in vLLM's SamplingParams.extra_args
SHARE_KEY = "streamrag_share"    # ... and of the request's tenant, weight and priority


def share_marks(tenant: str = "", weight: float = 1.0, priority: int = 0) -> dict[str, Any]:
    """The `extra_args` naming who a submission is for (fair share between tenants)."""
    return {SHARE_KEY: {"tenant": tenant, "weight": float(weight), "priority": int(priority)}}


def read_share(sampling_params: Any) -> tuple[str, float, int] | None:
    """(tenant, weight, priority) from a submission's sampling parameters; None when it names none."""
    extra = getattr(sampling_params, "extra_args", None)
    share = extra.get(SHARE_KEY) if isinstance(extra, Mapping) else None
    if not isinstance(share, Mapping):
        return None
    return str(share.get("tenant", "")), float(share.get("weight", 1.0)), int(share.get("priority", 0))


def stream_marks(complete: bool, chunk_at: float | None = None) -> dict[str, Any]:
    """The `extra_args` of one turn: context complete after it, and its chunk's arrival (time.time())."""
    return {MARKS_KEY: {"complete": bool(complete), "chunk_at": time.time() if chunk_at is None else chunk_at}}


def read_marks(sampling_params: Any) -> tuple[bool, float] | None:
    """(complete, chunk_at) from a turn's sampling parameters; None when the submission carries none
    (not ours: treated as a complete prompt that arrived at its vLLM arrival time)."""
    extra = getattr(sampling_params, "extra_args", None)
    marks = extra.get(MARKS_KEY) if isinstance(extra, Mapping) else None
    if not isinstance(marks, Mapping):
        return None
    return bool(marks.get("complete", True)), float(marks.get("chunk_at", 0.0))


@dataclass(eq=False, slots=True)
class PolicyView:
    """One vLLM request as our policies see it (the attributes `policies.py` reads)."""

    request_id: str
    source: Any                                # the vLLM request
    arrival_time: float
    last_chunk_arrival_time: float
    context_complete: bool = False
    num_computed_tokens: int = 0
    state: RequestState = RequestState.WAITING
    admitted_seq: int = -1
    preempted_at: float | None = None
    passed_over_since: float | None = None
    num_preemptions: int = 0
    tenant: str = ""                           # fair share (share_marks)
    tenant_weight: float = 1.0
    priority: int = 0
    num_schedulable_tokens: int = 1            # tokens it could compute now (fair share's cost)


# vLLM RequestStatus names that mean "holds device KV and is being computed"
RUNNING_STATUSES = frozenset({"RUNNING"})
# idle streaming sessions: waiting for their next input chunk, KV kept, nothing to compute
IDLE_STATUSES = frozenset({"WAITING_FOR_STREAMING_REQ"})


def status_name(request: Any) -> str:
    status = getattr(request, "status", None)
    return getattr(status, "name", str(status))


class PolicyRanker:
    """Ranks vLLM requests by one of our policies, keeping each request's policy view up to date."""

    def __init__(self, policy: Policy | str, clock: Callable[[], float] = time.time) -> None:
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.clock = clock
        self.views: dict[str, PolicyView] = {}
        self._admissions = 0

    # --- keeping views ------------------------------------------------------------------
    def view(self, request: Any, now: float) -> PolicyView:
        """The view of `request`, refreshed from it (vLLM's Request or anything with its attributes)."""
        rid = request.request_id
        view = self.views.get(rid)
        arrival = float(getattr(request, "arrival_time", now))
        if view is None:
            view = self.views[rid] = PolicyView(rid, request, arrival, arrival)
        view.source = request
        complete, chunk_at = self._marks(request, arrival)
        view.context_complete = complete
        if chunk_at > view.last_chunk_arrival_time:
            view.last_chunk_arrival_time = chunk_at
        view.num_computed_tokens = int(getattr(request, "num_computed_tokens", 0))
        view.num_schedulable_tokens = max(int(getattr(request, "num_tokens", 0)) - view.num_computed_tokens, 1)
        share = read_share(getattr(request, "sampling_params", None))
        if share is not None:
            view.tenant, view.tenant_weight, view.priority = share
        running = status_name(request) in RUNNING_STATUSES
        if running and view.state is not RequestState.RUNNING:
            view.admitted_seq = self._admissions
            self._admissions += 1
        view.state = RequestState.RUNNING if running else RequestState.WAITING
        preemptions = int(getattr(request, "num_preemptions", 0) or 0)
        if preemptions > view.num_preemptions:
            view.num_preemptions = preemptions
            view.preempted_at = now
        return view

    @staticmethod
    def _marks(request: Any, arrival: float) -> tuple[bool, float]:
        """Complete after the current turn or any turn queued behind it; the latest chunk's arrival."""
        marks = read_marks(getattr(request, "sampling_params", None))
        complete, chunk_at = marks if marks is not None else (True, arrival)
        for update in getattr(request, "streaming_queue", None) or ():
            queued = read_marks(getattr(update, "sampling_params", None)) if update is not None else None
            if queued is not None:
                complete = complete or queued[0]
                chunk_at = max(chunk_at, queued[1])
        return complete, chunk_at

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self.views.pop(rid, None)

    # --- ranking --------------------------------------------------------------------------
    def rank(self, requests: Sequence[Any], now: float | None = None,
             cached_prefix_tokens: Callable[[Any], int] | None = None) -> list[Any]:
        """`requests` (vLLM requests) highest priority first, by the policy. `cached_prefix_tokens`
        (of a vLLM request) feeds k-LPM."""
        now = self.clock() if now is None else now
        views = [self.view(r, now) for r in requests]
        if cached_prefix_tokens is None:
            ctx = PolicyContext(now)
        else:
            ctx = PolicyContext(now, lambda v: cached_prefix_tokens(v.source))
        return [v.source for v in self.policy.order(views, ctx)]

    def charge(self, scheduled_tokens: Mapping[str, int]) -> None:
        """The tokens vLLM scheduled this step, per request id: fair share counts them as computed."""
        for rid, tokens in scheduled_tokens.items():
            view = self.views.get(rid)
            if view is not None:
                self.policy.charge(view, int(tokens))

    def note_scheduled(self, scheduled_ids: set[str], runnable: Sequence[Any], now: float | None = None) -> None:
        """After a step: a runnable request not scheduled is passed over from now (LCAS's
        anti-starvation bound); a scheduled one is not."""
        now = self.clock() if now is None else now
        for request in runnable:
            view = self.views.get(request.request_id)
            if view is None:
                continue
            if request.request_id in scheduled_ids:
                view.passed_over_since = None
            elif view.passed_over_since is None:
                view.passed_over_since = now

    def is_complete(self, request: Any) -> bool:
        view = self.views.get(request.request_id)
        return True if view is None else view.context_complete
