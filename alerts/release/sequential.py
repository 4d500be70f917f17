"""Always-valid sequential tests: the one statistic every release check updates.

Each check (the canary's arm-against-arm checks, the paired checks, the stratified server
error and latency checks) updates a mixture sequential probability ratio test (mSPRT,
Johari et al., "Always valid inference", 2017) after *every* observation. The statistic is a
likelihood ratio averaged over a normal prior N(0, tau^2) on the effect; by Ville's
inequality its running maximum passes 1/alpha with probability at most alpha when there is
no effect, however often, and whenever, anyone looks. The always-valid p-value is
1 / max(1, that maximum).

Three parts, each written once here:
- `msprt_lambda`: the mixture likelihood ratio of an observed difference, and `msprt_radius`
  the always-valid confidence interval it implies;
- `Moments`: running count, mean and sum of squared deviations (Welford);
- `Evidence`: the running maximum in the bad `Direction` only, and the regression it marks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["Direction", "Evidence", "Moments", "msprt_lambda", "msprt_radius", "wrong_way"]

# which way of a difference is a regression ("either": any difference)
Direction = Literal["higher_is_worse", "lower_is_worse", "either"]


def msprt_lambda(delta: float, variance: float, tau: float) -> float:
    """The mixture likelihood ratio of an observed difference `delta` with sampling
    variance `variance`, mixed over N(0, tau^2) on the true difference."""
    if variance <= 0.0:
        return 1.0
    t2 = tau * tau
    log = 0.5 * math.log(variance / (variance + t2)) + (t2 * delta * delta) / (2 * variance * (variance + t2))
    return math.exp(min(log, 700.0))


def msprt_radius(variance: float, tau: float, alpha: float) -> float:
    """Half the width of the always-valid confidence interval the same mixture gives for the
    true difference: every difference within it of the observed one has a likelihood ratio
    under 1/alpha. A check whose whole interval lies on the good side of its null has shown,
    at level alpha, that the candidate does not regress by it (`cleared`)."""
    if variance <= 0.0:
        return 0.0
    t2 = tau * tau
    bound = math.log(1.0 / alpha) + 0.5 * math.log((variance + t2) / variance)
    return math.sqrt(2.0 * variance * (variance + t2) / t2 * bound)


def wrong_way(direction: Direction, delta: float) -> bool:
    """True when a difference `delta` (candidate minus reference) points the bad way."""
    if direction == "higher_is_worse":
        return delta > 0
    if direction == "lower_is_worse":
        return delta < 0
    return delta != 0


@dataclass
class Moments:
    """Running count, mean and sum of squared deviations of a stream of figures."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    @property
    def var(self) -> float:
        """The sample variance (0 below two figures)."""
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0


@dataclass
class Evidence:
    """One check's running maximum of the mixture likelihood ratio, counted only while the
    difference points the bad way, and whether it has passed 1/alpha (a regression stays one)."""

    direction: Direction
    tau: float
    max_lambda: float = 1.0
    regressed: bool = False

    def update(self, delta: float, variance: float, *, alpha: float) -> bool:
        """One look at the difference and its sampling variance -> regressed by now."""
        if wrong_way(self.direction, delta):
            self.max_lambda = max(self.max_lambda, msprt_lambda(delta, variance, self.tau))
            if self.max_lambda >= 1.0 / alpha:
                self.regressed = True
        return self.regressed

    @property
    def p_value(self) -> float:
        """The always-valid p-value: 1 / max(1, the running maximum)."""
        return min(1.0, 1.0 / self.max_lambda)
