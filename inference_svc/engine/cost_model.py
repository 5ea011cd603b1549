"""Preemption cost model: is it cheaper to recompute a victim's KV or to swap it to CPU?

`recompute_ms(tokens)` and `swap_ms(blocks)` are piecewise-linear fits through the medians
of an offline profile (`streamrag profile` writes it as JSON per device, model and dtype).
At each eviction the engine recomputes when `recompute_ms(tokens) < 2 * swap_ms(blocks)`
(a swap costs a copy out and a copy back in), else swaps.

Online refinement: the engine reports measured prefill and swap times; each curve keeps an
exponential moving average of measured/predicted and scales its predictions by it, so a
profile taken on an idle machine adapts to a busy one.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PiecewiseLinear:
    """y(x) through sorted (x, y) knots; straight-line extrapolation beyond both ends."""

    xs: list[float]
    ys: list[float]

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> PiecewiseLinear:
        merged: dict[float, list[float]] = {}
        for x, y in points:
            merged.setdefault(float(x), []).append(float(y))
        if len(merged) < 2:
            raise ValueError("a piecewise-linear fit needs measurements at two or more sizes")
        xs = sorted(merged)
        ys = [sorted(merged[x])[len(merged[x]) // 2] for x in xs]  # median per size
        return cls(xs, ys)

    def __call__(self, x: float) -> float:
        i = min(max(bisect.bisect_left(self.xs, x), 1), len(self.xs) - 1)
        x0, x1, y0, y1 = self.xs[i - 1], self.xs[i], self.ys[i - 1], self.ys[i]
        return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class OnlineScale:
    """EMA of measured/predicted, applied as a multiplier."""

    alpha: float = 0.1
    value: float = 1.0
    samples: int = 0

    def observe(self, predicted: float, measured: float) -> None:
        if predicted <= 0 or measured <= 0:
            return
        self.value += self.alpha * (measured / predicted - self.value)
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

    def prefer_recompute(self, tokens: int, blocks: int) -> bool:
        return self.recompute_ms(tokens) < 2 * self.swap_ms(blocks)

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
    def builtin(cls) -> CostModel:
        """A rough CPU-like default (used until `streamrag profile` has run): 0.5 ms/token, 0.02 ms/block."""
        return cls(PiecewiseLinear([0, 4096], [5.0, 2053.0]), PiecewiseLinear([0, 1024], [0.05, 20.5]))


def profile_path(cache_dir: Path, device: str, model: str, dtype: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{device}-{model}-{dtype}")
    return Path(cache_dir) / "profiles" / f"{safe}.json"
