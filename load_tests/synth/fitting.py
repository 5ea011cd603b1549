"""Distributions fitted to published summaries, and stratified draws from them.

Every total, count, gap and first-chunk time is a stratified draw (one uniform per quantile
slice, shuffled) pushed through a quantile function, so even 50 queries hit the targets.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist

_Z95 = NormalDist().inv_cdf(0.95)


def fit_split_lognormal(mean: float, p50: float, p95: float) -> tuple[float, float, float]:
    """(mu, sigma_below, sigma_above): a lognormal with its own spread on each side of the median.

    The median is p50, the spread above it puts the p95 at p95, and the spread below it makes
    the mean `mean`: mean / p50 = exp(sb^2/2) Phi(-sb) + exp(sa^2/2) Phi(sa), where the first
    term falls from 1/2 to 0 as sb grows (solved by bisection; sb = 0 when the mean is too high).
    """
    phi = NormalDist().cdf
    above = math.log(p95 / p50) / _Z95
    need = mean / p50 - math.exp(above ** 2 / 2) * phi(above)

    def below_term(sigma: float) -> float:
        return math.exp(sigma ** 2 / 2) * phi(-sigma)

    if need >= 0.5:
        return math.log(p50), 0.0, above
    low, high = 0.0, 10.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if below_term(mid) > need else (low, mid)
    return math.log(p50), (low + high) / 2, above


def stratified_uniforms(rng: random.Random, n: int) -> list[float]:
    """One uniform in each of the n slices of (0, 1), shuffled."""
    values = [min(max((i + rng.random()) / n, 1e-12), 1 - 1e-12) for i in range(n)]
    rng.shuffle(values)
    return values


def lognormal_quantile(u: float, mu: float, sigma: float, sigma_above: float | None = None) -> float:
    """The u-quantile of a lognormal; `sigma_above` (if given) is the spread above the median."""
    z = NormalDist().inv_cdf(u)
    return math.exp(mu + (sigma if z < 0 or sigma_above is None else sigma_above) * z)
