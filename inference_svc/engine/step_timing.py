"""A step's timing: what the engine measures of each step and where the figures go.

- the cost model (cost_model.py) learns from measured KV moves (`observe_swap`) and prefill-only
  forward passes (`observe_prefill`). A forward is known done at once on a synchronous runner (a
  CPU), and on an asynchronous one (a GPU) only once the step's tokens were read to the host;
- the step-time model of steps bounded in time (step_budget.py) refits from steps that prefilled;
- the step's figures become one frozen `StepStats` (`Engine.last_step`), with the device's kernel
  launches and host syncs when `EngineConfig.count_device_calls` asks (device_calls.py; only an
  asynchronous runner has any);
- the optional step log (step_log.py) gets one line per step that ran something.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from inference_svc.engine.cost_model import CostModel
from inference_svc.engine.device_calls import DeviceCalls, count_device_calls
from inference_svc.engine.request import Request
from inference_svc.engine.scheduler import BlockMove, SchedulerOutput
from inference_svc.engine.step_budget import StepBudget
from inference_svc.engine.step_log import StepLog


@dataclass(frozen=True)
class StepStats:
    """What the last step did (`Engine.last_step`): replaced as a whole after each step, never
    changed in place, so a reader on another thread sees one step's figures or the next's."""

    tokens: int = 0                     # tokens computed, drafts included (0: nothing could run)
    depths: tuple[int, ...] = ()        # the draft depth of each request that verified a draft
    decode_tokens: int = 0              # tokens computed for decoding requests, drafts included
    emitted: int = 0                    # tokens emitted (sampled or accepted)
    budget: int = 0                     # the step's token budget (below the configured one when bounded in time)
    ms: float = 0.0                     # the step's wall time: scheduling, KV moves, forward pass, sampling
    predicted_ms: float | None = None   # what the step-time model predicted for it (steps bounded in time)
    launches: int | None = None         # kernel and graph launches of the forward and sampling (counted on CUDA
    host_syncs: int | None = None       # with EngineConfig.count_device_calls) and waits for the device

    @property
    def draft_tokens(self) -> int:
        """Drafted tokens verified."""
        return sum(self.depths)


class StepTiming:
    """One engine's step timing: `begin`, then `move_blocks`, `run` (with `forward_started` and
    `forward_done` inside it), then `end` for the step's `StepStats`."""

    def __init__(self, cost_model: CostModel, step_budget: StepBudget | None, step_log: StepLog | None,
                 synchronous: bool, count_calls: bool = False) -> None:
        self.cost_model = cost_model
        self.step_budget = step_budget
        self.step_log = step_log
        self.synchronous = synchronous      # the runner's results are ready without a device sync
        self.count_calls = count_calls
        self._wall = self._started = self._moved = 0.0
        self._forward_started = 0.0
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._chunks: list[tuple[int, int]] = []
        self._calls: DeviceCalls | None = None

    def begin(self) -> None:
        self._wall = time.time()
        self._started = self._moved = time.perf_counter()

    def move_blocks(self, moves: Sequence[tuple[BlockMove, list[tuple[int, int]]]],
                    swap_out: Callable[[list[tuple[int, int]]], None],
                    swap_in: Callable[[list[tuple[int, int]]], None]) -> None:
        """Run the step's KV moves in decision order, and teach the cost model what they took."""
        self._moved = time.perf_counter()
        for direction, pairs in moves:
            (swap_out if direction is BlockMove.OUT else swap_in)(pairs)
        blocks = sum(len(pairs) for _, pairs in moves)
        self.cost_model.observe_swap(blocks, (time.perf_counter() - self._moved) * 1e3)

    def run(self, out: SchedulerOutput, run: Callable[[], int]) -> int:
        """Run the step's chunks (`run` returns the tokens emitted), counting device calls when asked."""
        self._decode_tokens = sum(c.num_tokens for c in out.chunks if c.request.is_decoding)  # before tokens
        self._chunks = [(c.start, c.num_tokens) for c in out.chunks]   # before the computed counts move
        self._calls = None
        if not out.chunks:
            return 0
        if self.count_calls and not self.synchronous:
            emitted, self._calls = count_device_calls(run)
            return emitted
        return run()

    def forward_started(self, out: SchedulerOutput) -> None:
        prefill_only = all(not chunk.request.is_decoding for chunk in out.chunks)
        self._prefill_tokens = out.num_tokens if prefill_only else 0
        self._forward_started = time.perf_counter()

    def forward_done(self, tokens_read: bool) -> None:
        """The forward may be done: at once on a synchronous runner; otherwise once `tokens_read`
        (the copy of the step's tokens to the host waited for it). A prefill-only one is observed."""
        if self._prefill_tokens and (self.synchronous or tokens_read):
            self.cost_model.observe_prefill(self._prefill_tokens, (time.perf_counter() - self._forward_started) * 1e3)
            self._prefill_tokens = 0

    def end(self, out: SchedulerOutput, emitted: int, budget: int, requests: Iterable[Request],
            free_blocks: Callable[[], int]) -> StepStats:
        """The step's figures (refitting the step-time model from a step that prefilled), logged."""
        step_ms = (time.perf_counter() - self._started) * 1e3
        predicted = None
        if self.step_budget is not None and self._decode_tokens < out.num_tokens:
            predicted = self.step_budget.observe(self._chunks, step_ms)
        calls = self._calls
        stats = StepStats(tokens=out.num_tokens, depths=tuple(len(c.draft) for c in out.chunks if c.draft),
                          decode_tokens=self._decode_tokens, emitted=emitted, budget=budget, ms=step_ms,
                          predicted_ms=predicted, launches=calls and calls.launches,
                          host_syncs=calls and calls.host_syncs)
        if self.step_log is not None and out.chunks:
            self._log(stats, out, requests, free_blocks())
        return stats

    def _log(self, stats: StepStats, out: SchedulerOutput, requests: Iterable[Request], free_blocks: int) -> None:
        bounded = {} if stats.predicted_ms is None else {"predicted_ms": round(stats.predicted_ms, 1)}
        scheduled = {chunk.request.request_id: chunk.num_tokens for chunk in out.chunks}
        complete = [chunk.request.request_id for chunk in out.chunks if chunk.request.context_complete]
        tokens_complete = sum(scheduled[rid] for rid in complete)
        waiting = sum(1 for r in requests if r.context_complete and r.is_runnable and r.request_id not in scheduled)
        self.step_log.write(self._wall, scheduled, complete, ms=round((time.perf_counter() - self._moved) * 1e3, 1),
                            tokens_complete=tokens_complete, tokens_partial=out.num_tokens - tokens_complete,
                            complete_not_scheduled=waiting, preempted=len(out.preempted), free_blocks=free_blocks,
                            budget=stats.budget, step_ms=round(stats.ms, 1), **bounded)
