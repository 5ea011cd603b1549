"""One request's draft depth: fixed, or auto from its own acceptance and the engine's load.

`DepthController` chooses k per request in auto mode (after SpecuStream, streamserve-paper
section 3.5): the request's recent acceptance (EMAs) sets how deep a draft pays off, the
engine's load lowers it (prefill's share of the last step makes verified tokens dearer, and an
engine-wide draft token budget is shared by the decoding requests), and when acceptance
collapses the depth drops to zero with a short probe every few steps so that a request that
starts quoting again recovers. What a verification really costs in the engine's batch is
measured by the gate (gate.py), which caps these depths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inference_svc.engine.options import MAX_SPECULATION_DEPTH


@dataclass(frozen=True)
class DepthSettings:
    max_depth: int = 8              # the deepest auto draft
    # What computing one more token in a step costs, as a share of a decode step's fixed cost
    # (reading the weights): measured with `streamrag bench decode --verify-cost` on cpu-2c (bf16
    # SmolLM2-135M, 768 cached tokens, batches 1/4/16, k 0-16): step ~ 76 ms + 2.9 ms per token,
    # 0.0384 (docs/results.md, "Speculative decoding"). auto_depth scales it by the batch's last step.
    cost_ratio: float = 0.0384
    ema_weight: float = 0.3         # weight of the newest verification in the acceptance EMAs
    probe_every: int = 16           # while no depth pays (acceptance collapsed): a probe every this many steps
    probe_depth: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.max_depth <= MAX_SPECULATION_DEPTH:
            raise ValueError(f"max_depth must be in [1, {MAX_SPECULATION_DEPTH}]")
        if not 0 < self.cost_ratio < 1:
            raise ValueError("cost_ratio must be in (0, 1)")


class DepthController:
    """One request's draft depth: fixed, or auto from its acceptance and the engine's load.

    Drafts from the context are bimodal: a draft either continues a passage the answer is quoting
    (and then most of it is accepted) or is wrong from its first token. So auto keeps two
    estimates, each EMA(accepted) / (EMA(accepted) + EMA(rejected)) over its verifications: p1,
    the chance that a draft's first token is accepted, and p, the chance that a later token is
    accepted given the ones before it were. The i-th draft token is accepted with chance
    p1 * p ** (i - 1), and the depth is the largest k with that above the cost of a verified token
    (`auto_depth`). Depth 0 (acceptance collapsed) still probes every `probe_every` steps.
    """

    def __init__(self, fixed_depth: int | None, settings: DepthSettings = DepthSettings()) -> None:
        self.fixed_depth = fixed_depth
        self.settings = settings
        self._first = [1.0, 1.0]   # EMAs of [accepted, rejected] first draft tokens: prior p1 0.5
        self._later = [1.0, 1.0]   # EMAs of later tokens accepted, and of rejections after the first: prior p 0.5
        self._decode_steps = 0

    @property
    def first_acceptance(self) -> float:
        """The estimated chance p1 that a draft's first token is accepted."""
        return self._first[0] / (self._first[0] + self._first[1])

    @property
    def acceptance(self) -> float:
        """The estimated chance p that a later draft token is accepted, the ones before it were."""
        return self._later[0] / (self._later[0] + self._later[1])

    def auto_depth(self, load: float = 0.0, batch_emitted: float = 1.0, batch_tokens: float = 1.0) -> int:
        """The depth that pays at this acceptance and load (0: none does).

        The i-th draft token is worth p1 * p ** (i - 1) tokens; verifying it adds `cost_ratio` of a
        one-token step's time to the step, time in which the whole batch emits `batch_emitted`
        tokens over a step of about 1 + cost_ratio * `batch_tokens` one-token-step units (the last
        step's figures). So it pays while p1 * p ** (i - 1) > cost_ratio * batch_emitted / (1 +
        cost_ratio * batch_tokens): deep drafts alone, shallower ones in a large batch, whose step
        is dearer. `load` (the share of the last step's budget prefill took) raises the cost
        towards 1."""
        s = self.settings
        c = s.cost_ratio
        cost = c * max(batch_emitted, 1.0) / (1.0 + c * max(batch_tokens, 1.0))
        cost = cost + (1.0 - cost) * min(max(load, 0.0), 0.9)
        p1, p = self.first_acceptance, min(self.acceptance, 0.99)
        if p1 <= cost:
            return 0
        if p <= cost / p1:
            return 1
        return min(s.max_depth, 1 + int(math.log(cost / p1) / math.log(p)))

    @property
    def collapsed(self) -> bool:
        return self.fixed_depth is None and self.auto_depth() == 0

    def depth(self, load: float = 0.0, share: int = MAX_SPECULATION_DEPTH, batch_emitted: float = 1.0,
              batch_tokens: float = 1.0) -> int:
        """Draft depth for the next step. `load`: share of the last step's token budget that
        non-draft work took (0..1); `share`: this request's part of the engine's draft budget;
        `batch_emitted` / `batch_tokens`: tokens the last step emitted / computed (auto_depth)."""
        if self.fixed_depth is not None:
            return self.fixed_depth
        s = self.settings
        self._decode_steps += 1
        depth = self.auto_depth(load, batch_emitted, batch_tokens)
        if depth == 0 and self._decode_steps % s.probe_every == 0:
            depth = s.probe_depth
        return min(depth, share)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            w = self.settings.ema_weight
            first_ok = accepted >= 1
            self._first = [(1 - w) * self._first[0] + w * first_ok, (1 - w) * self._first[1] + w * (not first_ok)]
            if first_ok and drafted > 1:    # the later tokens: accepted - 1 of them, then maybe a rejection
                self._later = [(1 - w) * self._later[0] + w * (accepted - 1),
                               (1 - w) * self._later[1] + w * (accepted < drafted)]
