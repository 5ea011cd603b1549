"""Steps bounded in time: how many tokens the next step may compute to stay within a target time.

A request cancelled, or one that arrives, while a step runs waits for that step to end: with a
fixed 2,048-token budget one fp32 prefill step takes seconds on a CPU. Given a target (the service
default is `DEFAULT_STEP_TIME_TARGET_MS` in options.py), each step's token budget is the most tokens
the step-time model predicts fit in it, never above the configured budget (the cap) and never below
`MIN_STEP_TOKENS` (so some work always runs).

The model comes from the cost model's prefill curve f (`CostModel.recompute`, the offline profile:
the time to prefill a prompt's first x tokens). A chunk of n tokens starting at token s costs
f(s + n) - f(s), its share of prefilling the prompt up to s + n (attention over the s tokens before
it included); a step pays f's floor (its cost at the smallest profiled size: a forward pass's fixed
overhead) once. A decode is a chunk of one token at the end of its sequence. The budget is found for
the deepest prompt still prefilling (a chunk nearer a prompt's start costs less, so the bound holds
for whichever prefills the scheduler picks) beside every decode that is runnable.

Online refit: after each step that prefilled, the measured step time over the prediction for what
ran moves a scale that multiplies every prediction (`StepScale`: an exponential moving average in log
space, each step's ratio clipped to [1/4, 4], so one step stalled by other work moves it by at most
`4 ** REFIT_ALPHA`, yet any error, a built-in estimate 40 times too fast included, is worked off in a
few steps). So a profile taken on an idle machine (or no profile) adapts to the machine as it is:
steps slower than predicted shrink the budget, faster ones grow it. The engine
writes the budget, the prediction and the measured time to the step log (step_log.py) and to
`Engine.last_step`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from inference_svc.engine.cost_model import CostModel, PiecewiseLinear
from inference_svc.engine.request import Request

MIN_STEP_TOKENS = 16            # the least a step may hold (one KV block at the default block size)
REFIT_ALPHA = 0.3               # weight of each measured step in the online scale
REFIT_MAX_RATIO = 4.0           # one step's measured/predicted counts at most this much either way


@dataclass
class StepScale:
    """Measured over predicted step time, as an exponential moving average of its logarithm."""

    alpha: float = REFIT_ALPHA
    value: float = 1.0
    samples: int = 0
    max_ratio: float = REFIT_MAX_RATIO

    def observe(self, predicted_ms: float, measured_ms: float) -> None:
        """`predicted_ms`: what the model, scaled by `value`, predicted for a step that took `measured_ms`."""
        if predicted_ms <= 0 or measured_ms <= 0:
            return
        ratio = min(max(measured_ms / predicted_ms, 1 / self.max_ratio), self.max_ratio)
        self.value *= math.exp(self.alpha * math.log(ratio))
        self.samples += 1


@dataclass
class StepBudget:
    """The token budget of each step for a step-time target; refit from measured steps."""

    curve: PiecewiseLinear          # prefill ms for a prompt's first x tokens (the cost model's profile)
    target_ms: float
    cap: int                        # the configured token budget: never exceeded
    min_tokens: int = MIN_STEP_TOKENS
    scale: StepScale = field(default_factory=StepScale)

    def __post_init__(self) -> None:
        if self.target_ms <= 0:
            raise ValueError(f"the step-time target must be positive, got {self.target_ms}")
        if self.cap < 1:
            raise ValueError("the token budget cap must be >= 1")
        self.min_tokens = max(1, min(self.min_tokens, self.cap))

    @classmethod
    def from_cost_model(cls, cost_model: CostModel, target_ms: float, cap: int) -> StepBudget:
        return cls(cost_model.recompute, target_ms, cap)

    # --- the model ------------------------------------------------------------------
    @property
    def fixed_ms(self) -> float:
        """A step's fixed cost: the curve at its smallest profiled size."""
        return self.curve(self.curve.xs[0])

    def chunk_ms(self, start: int, tokens: int) -> float:
        """Unscaled cost of computing `tokens` tokens from token `start` on, beyond the fixed cost."""
        return self.curve(start + tokens) - self.curve(start) if tokens > 0 else 0.0

    def predict_ms(self, chunks: Iterable[tuple[int, int]]) -> float:
        """Predicted time of a step computing these (start, tokens) chunks."""
        return self.scale.value * (self.fixed_ms + sum(self.chunk_ms(s, n) for s, n in chunks))

    def tokens_for(self, start: int, base_ms: float = 0.0) -> int:
        """Most tokens a prefill from token `start` may take so that the step, with `base_ms` of other
        (unscaled) work beside it, is predicted within the target; 0 when even one token is not."""
        limit = self.target_ms / self.scale.value - self.fixed_ms - base_ms
        if limit < 0 or self.chunk_ms(start, 1) > limit:
            return 0
        lo, hi = 1, self.cap                  # chunk_ms never decreases with tokens: bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.chunk_ms(start, mid) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # --- per step -------------------------------------------------------------------
    def budget(self, requests: Iterable[Request]) -> int:
        """The next step's token budget, for the requests there are (only runnable ones count)."""
        decodes = 0
        decode_ms = 0.0
        deepest: int | None = None            # the furthest start of a prefill still to do
        for request in requests:
            if not request.is_runnable:
                continue
            start = request.num_computed_tokens
            if request.is_decoding and request.num_pending_tokens == 1:
                decodes += 1
                decode_ms += self.chunk_ms(start, 1)
            elif deepest is None or start > deepest:
                deepest = start
        if deepest is None:                   # decodes only: one token each, nothing to cut
            return self.cap
        return max(self.min_tokens, min(self.cap, decodes + self.tokens_for(deepest, decode_ms)))

    def observe(self, chunks: Iterable[tuple[int, int]], measured_ms: float) -> float:
        """Refit from a step that ran these (start, tokens) chunks in `measured_ms`; returns what the
        model had predicted for them."""
        predicted = self.predict_ms(chunks)
        self.scale.observe(predicted, measured_ms)
        return predicted
