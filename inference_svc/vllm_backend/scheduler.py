"""Our policies as a vLLM V1 scheduler class (`scheduler_cls`), no fork.

vLLM's `Scheduler.schedule()` serves `running` in list order, then the waiting queues
(`kv_holding_waiting`, requests that keep KV blocks such as streaming sessions between turns,
before `waiting`), and when a running request cannot get blocks it preempts `running[-1]`
(under vLLM's "fcfs" queue policy, which this class runs on). So each step, before vLLM's
own pass, `PolicyStreamingScheduler`:

1. ranks every unfinished request by our policy (`ranking.PolicyRanker`, over the same
   policy classes as the native engine), with the streaming marks the backend's session
   code put on each turn (context complete or not, the chunk's arrival);
2. orders `running` and both waiting queues by that rank, so vLLM's own scan follows our
   order and its preemption (`running[-1]`) takes the lowest priority first;
3. lets the highest-ranked ready waiting request overtake lower-ranked work that vLLM would
   otherwise serve first (running prefills, of partial prompts or of complete ones ranked below
   it, and KV-holding waiting requests when it is in `waiting`): as many of them as would leave
   it less of the token budget than it can use sit this step out, lowest rank first (they keep
   their KV); the others keep their turn, so the step's budget is not spent on the top request
   alone. If the device pool cannot hold the overtaking request, the lowest-ranked of those
   running prefills are preempted (recompute) until it can;
4. after vLLM's pass, puts them back and records who was passed over (LCAS's starvation bound).

vLLM's streaming sessions idle between turns (`WAITING_FOR_STREAMING_REQ`) keep their KV and
vLLM gives no way to preempt them; they are ranked but never evicted here (docs/vllm.md).
The policy's name comes from `vllm_config.additional_config["streamrag_policy"]` (set by
`config.engine_args`), since this class is built inside vLLM's engine-core process.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from inference_svc.engine.policies import make_policy
from inference_svc.engine.step_log import StepLog
from inference_svc.vllm_backend.config import POLICY_KEY, POLICY_OPTIONS_KEY
from inference_svc.vllm_backend.ranking import PolicyRanker

_READY = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
# Set to a path prefix, the class writes one JSON line per step to PREFIX.<pid>.jsonl (benchmark
# evidence: queue lengths, what it held back or preempted (ours; total: vLLM's and ours), tokens
# scheduled to complete and partial prompts, and per request: "scheduled" maps each request id to its
# tokens this step, "complete" lists the ids of those whose context is complete; the time of this
# schedule() call, of update_from_output since the previous step, and in the garbage collector: a slow
# step can be told apart from one whose time went to the model). Unset: nothing is written.
STEP_LOG_ENV = "STREAMRAG_VLLM_STEP_LOG"


class PolicySchedulingMixin:
    """The policy step around vLLM's `schedule()`; mixed into `Scheduler` or `AsyncScheduler`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.vllm_config.additional_config or {}
        name = extra.get(POLICY_KEY)
        if name is None:
            raise ValueError(f"{type(self).__name__} needs additional_config[{POLICY_KEY!r}] (our policy's name)")
        if self.policy.value != "fcfs":
            raise ValueError(f"{type(self).__name__} runs on vLLM's 'fcfs' queues (it orders them itself), "
                             f"got scheduling_policy={self.policy.value!r}")
        self.ranker = PolicyRanker(make_policy(name, **extra.get(POLICY_OPTIONS_KEY, {})))
        self._preempted_in_step = 0
        self._step_log = StepLog.from_env(STEP_LOG_ENV)
        self._update_s = 0.0   # time in update_from_output since the last logged step

    # --- the step -------------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any):
        now, started = time.time(), time.perf_counter()
        self._preempted_in_step = 0
        held_running, held_waiting, runnable = self._arrange(now)
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self.running.extend(held_running)
            self.kv_holding_waiting.extend(held_waiting)
            self._order_running()
        self.ranker.note_scheduled(set(out.num_scheduled_tokens), runnable, now)
        self.ranker.charge(out.num_scheduled_tokens)        # fair share between tenants, when on
        if self._step_log is not None:
            self._log_step(now, out, runnable, len(held_running), len(held_waiting), time.perf_counter() - started)
        return out

    def update_from_output(self, *args: Any, **kwargs: Any):
        started = time.perf_counter()
        try:
            return super().update_from_output(*args, **kwargs)
        finally:
            self._update_s += time.perf_counter() - started

    def _log_step(self, now: float, out: Any, runnable: list, held_running: int, held_waiting: int,
                  schedule_s: float) -> None:
        tokens = out.num_scheduled_tokens
        complete = partial = 0
        complete_ids = []
        for rid, n in tokens.items():
            request = self.requests.get(rid)
            if request is not None and not self.ranker.is_complete(request):
                partial += n
            else:
                complete += n
                complete_ids.append(rid)
        waiting_complete = sum(1 for r in runnable if r.request_id not in tokens and self.ranker.is_complete(r))
        self._step_log.write(
            now, dict(tokens), complete_ids, running=len(self.running), waiting=len(self.waiting),
            kv_holding=len(self.kv_holding_waiting), idle=getattr(self, "num_waiting_for_streaming_input", 0),
            held_running=held_running, held_waiting=held_waiting, preempted=self._preempted_in_step,
            preempted_total=len(getattr(out, "preempted_req_ids", None) or ()), tokens_complete=complete,
            tokens_partial=partial, requests=len(tokens), complete_not_scheduled=waiting_complete,
            free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
            schedule_ms=round(schedule_s * 1000, 2), update_ms=round(self._update_s * 1000, 2))
        self._update_s = 0.0

    def _free_request(self, request, *args: Any, **kwargs: Any):
        self.ranker.forget((request.request_id,))
        return super()._free_request(request, *args, **kwargs)

    # --- ordering ---------------------------------------------------------------------------
    def _arrange(self, now: float) -> tuple[list, list, list]:
        live = [*self.running, *self.kv_holding_waiting, *self.waiting]
        if not live:
            return [], [], []
        self._rank = {r.request_id: i for i, r in enumerate(self.ranker.rank(live, now, self._cached_prefix_tokens))}
        runnable = [r for r in live if r.status is RequestStatus.RUNNING or r.status in _READY]
        self._order_running()
        self._order_queue(self.kv_holding_waiting)
        self._order_queue(self.waiting)
        top, top_in_waiting = self._top_ready_waiting()
        if top is None:
            return [], [], runnable
        rank = self._rank
        limit = rank[top.request_id]
        # What vLLM serves before `top` this step although it ranks below it: running prefills
        # (running goes first; a complete one too, for example under fcfs a prompt whose context
        # completed after `top`'s, which non-streaming would serve after it) and, if `top` is in
        # `waiting`, the ready KV-holding
        # requests (that queue is drained before `waiting`). When `top` is itself KV-holding, the
        # lower-ranked ones of that queue come after it in vLLM's scan and need no holding back.
        before = [r for r in self.running if rank[r.request_id] > limit and self._prefilling(r)]
        if top_in_waiting:
            before += [r for r in self.kv_holding_waiting if rank[r.request_id] > limit and r.status in _READY]
        held = self._to_hold(top, limit, before)
        if self._blocks_short(top):   # the pool cannot hold `top`: every running one of `before` may give way
            ids = {r.request_id for r in held}
            held += [r for r in before if r.status is RequestStatus.RUNNING and r.request_id not in ids]
        if not held:
            return [], [], runnable
        self._make_room(top, [r for r in held if r.status is RequestStatus.RUNNING], now)
        held_running = [r for r in held if r.status is RequestStatus.RUNNING]   # not preempted just now
        held_waiting = [r for r in held if r.status in _READY and self._in_kv_holding(r)]
        if held_running:
            gone = set(held_running)
            self.running = [r for r in self.running if r not in gone]
        if held_waiting:
            self.kv_holding_waiting.remove_requests(held_waiting)
        self._order_queue(self.waiting)   # preempted requests were prepended
        return held_running, held_waiting, runnable

    def _order_running(self) -> None:
        rank, last = self._rank_of, len(self.ranker.views)
        self.running.sort(key=lambda r: rank(r, last))

    def _order_queue(self, queue) -> None:
        if len(queue) > 1:
            rank, last = self._rank_of, len(self.ranker.views)
            ordered = sorted(queue, key=lambda r: rank(r, last))
            queue.clear()
            queue.extend(ordered)

    def _rank_of(self, request, default: int) -> int:
        return getattr(self, "_rank", {}).get(request.request_id, default)

    def _top_ready_waiting(self):
        """The highest-ranked waiting request vLLM could start now (not an idle session), and
        whether it is in `waiting` (else in `kv_holding_waiting`)."""
        firsts = [(r, queue is self.waiting) for queue in (self.kv_holding_waiting, self.waiting)
                  if (r := next((r for r in queue if r.status in _READY), None)) is not None]  # rank order
        return min(firsts, key=lambda f: self._rank[f[0].request_id]) if firsts else (None, False)

    def _in_kv_holding(self, request) -> bool:
        return any(r is request for r in self.kv_holding_waiting)

    def _to_hold(self, top, limit: int, before: list) -> list:
        """The requests of `before` (lower-ranked work vLLM would serve ahead of `top`) to leave out
        of this step so that `top`, and the other ready complete prompts waiting, get as much of the
        token budget as they can use: the highest-ranked of `before` keep their turn while their
        pending tokens fit in what the waiting ones do not need; only the rest are held back (a step
        is not spent on the waiting ones alone). Against a partial prompt every waiting complete
        prompt counts (speculative work never delays complete work, whatever the policy); against a
        complete one, only those the policy ranks above it."""
        if not before:
            return []
        budget = self.max_num_scheduled_tokens
        above = sum(self._pending(r) for r in self.running if self._rank[r.request_id] < limit)
        left = max(0, budget - above)
        kept, held = 0, []
        for request in sorted(before, key=lambda r: self._rank[r.request_id]):
            rank = self._rank[request.request_id] if self.ranker.is_complete(request) else None
            pending = self._pending(request)
            if kept + pending + self._waiting_need(top, ranked_above=rank) <= left:
                kept += pending
            else:
                held.append(request)
        return held

    def _waiting_need(self, top, ranked_above: int | None = None) -> int:
        """Pending tokens of `top` and of every other ready waiting request whose context is complete
        (with `ranked_above`, of those the policy ranks above that rank)."""
        others = (r for queue in (self.kv_holding_waiting, self.waiting) for r in queue
                  if r is not top and r.status in _READY and self.ranker.is_complete(r)
                  and (ranked_above is None or self._rank[r.request_id] < ranked_above))
        return self._pending(top) + sum(self._pending(r) for r in others)

    @staticmethod
    def _pending(request) -> int:
        return max(1, request.num_tokens - request.num_computed_tokens)

    @staticmethod
    def _prefilling(request) -> bool:
        """A running request still computing its prompt (partial or complete; not decoding: vLLM resets
        `num_prompt_tokens` with each streaming turn), with no sampled token in flight (async
        scheduling): safe to leave out of one step."""
        return request.num_output_placeholders == 0 and request.num_computed_tokens < request.num_prompt_tokens

    def _blocks_short(self, top) -> bool:
        """Whether the device pool cannot hold `top`'s uncomputed tokens now."""
        needed = -(-(top.num_tokens - top.num_computed_tokens) // self.block_size)
        return self.kv_cache_manager.block_pool.get_num_free_blocks() < needed

    def _make_room(self, top, victims: list, now: float) -> None:
        """Preempt (recompute) the lowest-ranked `victims` until the device pool can hold `top`'s
        uncomputed tokens: our eviction order, lowest priority first."""
        for victim in sorted(victims, key=lambda r: self._rank[r.request_id], reverse=True):
            if not self._blocks_short(top):
                return
            if victim.status is not RequestStatus.RUNNING or not self._request_blocks_can_be_freed(victim):
                continue
            self.running.remove(victim)
            self._preempt_request(victim, time.monotonic())
            self._preempted_in_step += 1

    def _cached_prefix_tokens(self, request) -> int:
        """k-LPM's prefix match: tokens computed, else the longest prefix-cache hit (read only)."""
        if request.num_computed_tokens:
            return request.num_computed_tokens
        if not request.block_hashes:
            return 0
        _, tokens, *_ = self.kv_cache_manager.coordinator.find_longest_cache_hit(request.block_hashes,
                                                                                request.num_tokens - 1)
        return tokens


class PolicyStreamingScheduler(PolicySchedulingMixin, AsyncScheduler):
    """Our policy on vLLM's async scheduler (the default when async scheduling is on)."""


class PolicyStreamingSyncScheduler(PolicySchedulingMixin, Scheduler):
    """Our policy on vLLM's synchronous scheduler (when vLLM turns async scheduling off)."""
