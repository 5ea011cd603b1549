"""Auto speculation never costs: the engine measures what its drafts earn and caps them where they do not.

Each request's depth controller (depth.py) prices a verified token with a fixed model of the step.
In a batch that model can be wrong (verifying sequences cost more than their tokens), and then
drafts that the controller expects to pay make every step slower. The gate checks the outcome
instead of the model. Over decode-only steps it keeps

- the time of a plain step (no draft verified) at each batch size, from recent plain steps;
- per batch-size bucket (1, 2-3, 4-7, 8-15, ...), EMAs of the tokens that steps with auto drafts
  emitted, and of the tokens plain steps would have emitted in the same time (batch x step time /
  plain step time). Their ratio is what auto drafting gains there: the decode throughput with
  drafts over the throughput without.

and sets each bucket's cap on the auto depth: no cap, 4, 2, 1 or off. After `min_samples` drafted
steps at a cap, a gain below `floor` moves to the deepest cap below the mean depth drafted there
(off below the shallowest: a cap that would not change the drafts is skipped), and a gain above
`raise_at` one cap deeper (not back into a cap just left for being slow, for
`probe_after` steps). While off, a probe at the shallowest cap runs after `probe_after` decode
steps, doubling after each probe that fails, so that a bucket whose drafts start paying again (a
new workload) comes back. A plain step is forced (cap 0 for one step) when no recent one gives a
reference for the batch. Steps with fixed-depth drafts are not judged.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class GateSettings:
    caps: tuple[int, ...] = (1, 2, 4)   # the depth caps below "no cap", shallowest first; below them: off
    ema_weight: float = 0.25            # weight of the newest drafted step in the gain's EMAs
    min_samples: int = 4                # drafted steps measured at a cap before it is judged
    floor: float = 0.99                 # a gain below it: one cap shallower
    raise_at: float = 1.10              # a gain above it: one cap deeper
    reference_age: int = 24             # decode steps after which a plain step's time is no reference
    probe_after: int = 32               # decode steps off before a probe; doubles after each failed probe
    max_probe_after: int = 256

    def __post_init__(self) -> None:
        if not self.caps or any(c < 1 for c in self.caps) or list(self.caps) != sorted(set(self.caps)):
            raise ValueError("caps must be increasing depths >= 1")
        if not 0 < self.ema_weight <= 1 or self.min_samples < 1 or not 0 < self.floor <= self.raise_at:
            raise ValueError("need 0 < ema_weight <= 1, min_samples >= 1 and 0 < floor <= raise_at")


@dataclass
class _Bucket:
    """One batch-size bucket's cap and what drafts earned at it."""

    level: int                          # index into SpeculationGate.levels
    tokens: float = 0.0                 # EMA of tokens emitted by drafted steps
    plain_tokens: float = 0.0           # EMA of tokens plain steps would have emitted in their time
    samples: int = 0
    drafted: int = 0                    # draft tokens verified at this cap ...
    drafting: int = 0                   # ... by this many requests' drafts
    probing: bool = False
    off_since: int = 0                  # the decode step it went off at
    probe_after: int = 0
    barred: int | None = None           # a level just left for being slow ...
    barred_until: int = 0               # ... is not re-entered before this decode step


class SpeculationGate:
    """Caps auto draft depths per batch size where measured drafts do not pay (module docstring)."""

    def __init__(self, settings: GateSettings = GateSettings(), cost_ratio: float = 0.0384) -> None:
        self.settings = settings
        self.cost_ratio = cost_ratio    # scales a plain step's time to a nearby batch size (depth.DepthSettings)
        self.levels: tuple[int | None, ...] = (0, *settings.caps, None)   # None: no cap
        self._buckets: dict[int, _Bucket] = {}
        self._plain: dict[int, tuple[deque[float], int]] = {}   # batch -> (recent plain step ms, step seen)
        self._step = 0                  # decode-only steps observed

    def cap(self, batch: int) -> int | None:
        """The deepest auto draft for a step of `batch` decoding requests: None (no cap), a depth, or
        0 (no auto draft: off there, or a plain step is due to time the batch without drafts)."""
        cap = self.levels[self._bucket(batch).level]
        if cap != 0 and self._reference(batch) is None:
            return 0
        return cap

    def observe(self, batch: int, drafted: int, emitted: int, ms: float, drafting: int = 1) -> None:
        """One decode-only step: `batch` requests decoding, `drafted` auto draft tokens verified (0: a
        plain step) by `drafting` of them, `emitted` tokens, `ms` its wall time."""
        if batch <= 0 or ms <= 0:
            return
        self._step += 1
        bucket = self._bucket(batch)
        if drafted == 0:
            times, _ = self._plain.get(batch, (deque(maxlen=3), 0))
            times.append(ms)
            self._plain[batch] = (times, self._step)
            if bucket.level == 0 and self._step - bucket.off_since >= bucket.probe_after:
                self._move(bucket, 1, probing=True)
            return
        reference = self._reference(batch)
        if reference is None or bucket.level == 0:
            return
        s = self.settings
        plain_tokens = batch * ms / reference
        if bucket.samples == 0:
            bucket.tokens, bucket.plain_tokens = float(emitted), plain_tokens
        else:
            bucket.tokens += s.ema_weight * (emitted - bucket.tokens)
            bucket.plain_tokens += s.ema_weight * (plain_tokens - bucket.plain_tokens)
        bucket.samples += 1
        bucket.drafted += drafted
        bucket.drafting += max(drafting, 1)
        if bucket.samples < s.min_samples:
            return
        gain = self.gain(batch)
        if gain < s.floor:
            mean_depth = bucket.drafted / bucket.drafting
            self._move(bucket, max((i for i, cap in enumerate(self.levels[:bucket.level])
                                    if i == 0 or cap < mean_depth), default=0))
        elif bucket.probing:        # a probe that pays: the bucket is back, probes at the first interval again
            bucket.probing, bucket.probe_after = False, s.probe_after
        if gain > s.raise_at and bucket.level < len(self.levels) - 1 and not self._barred(bucket, bucket.level + 1):
            self._move(bucket, bucket.level + 1)

    def gain(self, batch: int) -> float | None:
        """What auto drafts earn at this batch size's bucket and cap: tokens/s with them over without
        (None: not measured yet)."""
        bucket = self._bucket(batch)
        return bucket.tokens / bucket.plain_tokens if bucket.samples and bucket.plain_tokens > 0 else None

    def _move(self, bucket: _Bucket, level: int, probing: bool = False) -> None:
        s = self.settings
        if level < bucket.level:    # left for being slow: not re-entered for a while
            bucket.barred, bucket.barred_until = bucket.level, self._step + bucket.probe_after
            if level == 0:
                bucket.off_since = self._step
                if bucket.probing:
                    bucket.probe_after = min(2 * bucket.probe_after, s.max_probe_after)
        bucket.level, bucket.probing = level, probing
        bucket.tokens = bucket.plain_tokens = 0.0
        bucket.samples = bucket.drafted = bucket.drafting = 0

    def _barred(self, bucket: _Bucket, level: int) -> bool:
        return bucket.barred == level and self._step < bucket.barred_until

    def _bucket(self, batch: int) -> _Bucket:
        key = max(batch, 1).bit_length()
        if key not in self._buckets:
            self._buckets[key] = _Bucket(level=len(self.levels) - 1, probe_after=self.settings.probe_after)
        return self._buckets[key]

    def _reference(self, batch: int) -> float | None:
        """A plain step's time at `batch`: the median of its recent ones, or a nearby batch size's scaled
        by the step-cost model (None: no plain step recent and near enough)."""
        fresh = {b: times for b, (times, seen) in self._plain.items()
                 if self._step - seen < self.settings.reference_age and abs(b - batch) <= max(1, batch // 4)}
        if not fresh:
            return None
        nearest = min(fresh, key=lambda b: (abs(b - batch), b))
        c = self.cost_ratio
        return statistics.median(fresh[nearest]) * (1 + c * batch) / (1 + c * nearest)
