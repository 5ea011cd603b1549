"""Preemption cost model: is it cheaper to recompute a victim's KV or to swap it to CPU?

`recompute_ms(tokens)` and `swap_ms(blocks)` are piecewise-linear fits through the medians
of an offline profile (`streamrag profile` writes it as JSON per device, model and dtype).
At each eviction the engine recomputes when `recompute_ms(tokens) < 2 * swap_ms(blocks)`
(a swap costs a copy out and a copy back in), else swaps.

A fit can be trusted: it never decreases and never reaches zero. Medians that fall with
size (a profile taken while other work ran: 2,709 ms for 16 tokens, 2,188 ms for 128) are
pooled into a non-decreasing curve (isotonic regression), the curve is flat below its first
size, and beyond its last size it keeps rising at least at the average cost per unit, so a
long prompt never looks free to recompute. `check_profile` says what is wrong with a
profile before it is used: another device, model, dtype or block size, or measurements
that fall with size.

Online refinement: the engine reports measured prefill and swap times; each curve keeps an
exponential moving average of measured/predicted and scales its predictions by it, so a
profile taken on an idle machine adapts to a busy one.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def _non_decreasing(ys: list[float], weights: list[int]) -> list[float]:
    """Isotonic regression (pool adjacent violators): the closest non-decreasing sequence."""
    blocks: list[list[float]] = []          # [mean, weight, count]
    for y, w in zip(ys, weights, strict=True):
        blocks.append([y, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            y2, w2, n2 = blocks.pop()
            y1, w1, n1 = blocks[-1]
            blocks[-1] = [(y1 * w1 + y2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [mean for mean, _, count in blocks for _ in range(int(count))]


MIN_COST_MS = 1e-3          # no fitted cost is ever below this: nothing is free


@dataclass
class PiecewiseLinear:
    """y(x) through sorted (x, y) knots: flat below the first, rising beyond the last at least
    at the average y/x, never decreasing and never below `MIN_COST_MS`."""

    xs: list[float]
    ys: list[float]
    adjusted: bool = False      # fit() had to pool measurements that fell with size

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> PiecewiseLinear:
        merged: dict[float, list[float]] = {}
        for x, y in points:
            merged.setdefault(float(x), []).append(float(y))
        if len(merged) < 2:
            raise ValueError("a piecewise-linear fit needs measurements at two or more sizes")
        xs = sorted(merged)
        medians = [sorted(merged[x])[len(merged[x]) // 2] for x in xs]  # median per size
        ys = _non_decreasing(medians, [len(merged[x]) for x in xs])
        return cls(xs, ys, adjusted=any(abs(a - b) > 1e-9 for a, b in zip(ys, medians, strict=True)))

    @property
    def tail_slope(self) -> float:
        last = (self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2])
        return max(last, self.ys[-1] / self.xs[-1] if self.xs[-1] > 0 else 0.0, 0.0)

    def __call__(self, x: float) -> float:
        if x <= self.xs[0]:
            y = self.ys[0]
        elif x >= self.xs[-1]:
            y = self.ys[-1] + self.tail_slope * (x - self.xs[-1])
        else:
            i = bisect.bisect_left(self.xs, x)
            x0, x1, y0, y1 = self.xs[i - 1], self.xs[i], self.ys[i - 1], self.ys[i]
            y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return max(MIN_COST_MS, y)


PROFILE_KEYS = ("device", "model", "dtype", "block_size")


def check_profile(profile: dict, expected: dict | None = None) -> list[str]:
    """What is wrong with a profile: keys that differ from `expected` (device, model, dtype,
    block size) and curves whose measurements fall with size. Empty when it can be trusted."""
    problems = []
    for key in PROFILE_KEYS:
        if expected and key in expected and key in profile and str(profile[key]) != str(expected[key]):
            problems.append(f"{key} is {profile[key]!r}, this engine runs {expected[key]!r}")
    for curve in ("recompute_ms", "swap_ms"):
        fitted = PiecewiseLinear.fit([tuple(p) for p in profile[curve]])
        if fitted.adjusted:
            problems.append(f"{curve} falls with size (measured under contention?): refit as non-decreasing")
    return problems


@dataclass
class OnlineScale:
    """EMA of measured/predicted, applied as a multiplier. One observation's ratio counts at most
    `max_ratio` either way, so a single step stalled by other work cannot swing the model."""

    alpha: float = 0.1
    value: float = 1.0
    samples: int = 0
    max_ratio: float = 8.0

    def observe(self, predicted: float, measured: float) -> None:
        if predicted <= 0 or measured <= 0:
            return
        ratio = min(max(measured / predicted, 1 / self.max_ratio), self.max_ratio)
        self.value += self.alpha * (ratio - self.value)
        self.samples += 1


@dataclass
class CostModel:
    recompute: PiecewiseLinear
    swap: PiecewiseLinear
    source: str = "built-in"
    recompute_scale: OnlineScale = field(default_factory=OnlineScale)
    swap_scale: OnlineScale = field(default_factory=OnlineScale)

    def recompute_ms(self, tokens: int) -> float:
        return self.recompute(tokens) * self.recompute_scale.value if tokens > 0 else 0.0

    def swap_ms(self, blocks: int) -> float:
        return self.swap(blocks) * self.swap_scale.value if blocks > 0 else 0.0

    def prefer_recompute(self, tokens: int, blocks: int, keep_fraction: float = 1.0) -> bool:
        """Recompute when that costs less than a swap out and back in. KV expected to be
        invalidated anyway (an update-mode prompt mid-refinement keeps `keep_fraction` of it) is
        worth only that share of its recompute cost."""
        return self.recompute_ms(tokens) * keep_fraction < 2 * self.swap_ms(blocks)

    def observe_prefill(self, tokens: int, measured_ms: float) -> None:
        self.recompute_scale.observe(self.recompute(tokens), measured_ms)

    def observe_swap(self, blocks: int, measured_ms: float) -> None:
        self.swap_scale.observe(self.swap(blocks), measured_ms)

    # --- persistence ----------------------------------------------------------------
    @classmethod
    def from_profile(cls, profile: dict) -> CostModel:
        return cls(
            recompute=PiecewiseLinear.fit([tuple(p) for p in profile["recompute_ms"]]),
            swap=PiecewiseLinear.fit([tuple(p) for p in profile["swap_ms"]]),
            source=profile.get("path", "profile"),
        )

    @classmethod
    def load(cls, path: Path) -> CostModel:
        profile = json.loads(Path(path).read_text())
        profile["path"] = str(path)
        return cls.from_profile(profile)

    @classmethod
    def load_checked(cls, path: Path, expected: dict, warn: Callable[[str], None]) -> CostModel:
        """Load a profile made for this engine (device, model, dtype, block size), else the
        built-in estimate; a profile with falling measurements is used refit, with a warning.
        Either way the online scale then adapts the predictions to measured step times."""
        profile = json.loads(Path(path).read_text())
        profile["path"] = str(path)
        problems = check_profile(profile, expected)
        mismatched = [p for p in problems if not p.endswith("refit as non-decreasing")]
        if mismatched:
            warn(f"cost profile {path} does not fit this engine ({'; '.join(mismatched)}): using the built-in "
                 f"estimate; re-measure with `streamrag profile`")
            return cls.builtin()
        if problems:
            warn(f"cost profile {path}: {'; '.join(problems)}; re-measure on an idle machine with `streamrag profile`")
        return cls.from_profile(profile)

    @classmethod
    def builtin(cls) -> CostModel:
        """A rough CPU-like default (used until `streamrag profile` has run): 0.5 ms/token, 0.02 ms/block."""
        return cls(PiecewiseLinear([0, 4096], [5.0, 2053.0]), PiecewiseLinear([0, 1024], [0.05, 20.5]))


def profile_path(cache_dir: Path, device: str, model: str, dtype: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{device}-{model}-{dtype}")
    return Path(cache_dir) / "profiles" / f"{safe}.json"
