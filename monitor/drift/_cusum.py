"""A Bernoulli CUSUM on tail exceedances, its threshold calibrated by simulation.

Each observation is reduced to one bit: is its score beyond the reference's own
`tail` quantile? In control the bit is 1 with probability `β` (about `tail`); the chart is
tuned to detect a rise to `ρ = factor · β`. With `u = log(ρ/β)` and `d = log((1-ρ)/(1-β))`,
`S ← max(0, S + (u if bit else d))` and an alarm (then a reset) when `S ≥ h`.

`h` is chosen by simulation: in-control streams are drawn at the in-control rate (for a
reference, its upper confidence bound; see `design_cusum`), many CUSUMs (one per
candidate `h`) run on them at once, and the average run length between false alarms
(steps / alarms; the chart restarts from 0 after each alarm) is interpolated at the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._conditional import exceedance_upper, tail_cut

__all__ = ["CusumDesign", "TailCusum", "design_cusum"]


@dataclass(frozen=True)
class CusumDesign:
    cut: float  # scores > cut count as exceedances
    in_control_rate: float  # β, measured on the reference's scores
    alarm_rate: float  # ρ, the rate the chart is tuned to detect
    up: float  # increment for an exceedance
    down: float  # increment otherwise (negative)
    threshold: float  # h
    target_arl: float
    simulated_arl: float  # ARL at `threshold` in the simulation
    simulated_steps: int


def design_cusum(
    in_control_scores: np.ndarray,
    *,
    tail: float = 0.05,
    factor: float = 3.0,
    target_arl: float = 1000.0,
    seed: int = 0,
    streams: int = 256,
    reference_confidence: float | None = None,
) -> CusumDesign:
    """Design the chart for scores where larger means more anomalous.

    `reference_confidence=None`: the scores *are* the in-control law (streams resample
    them). With a confidence, they are a sample from it (the reference's held-out scores):
    the cut is their `k`-th largest and the chart is designed for `β⁺`, the upper
    `reference_confidence` bound of the chance a new score exceeds that cut (`_conditional`),
    so its run length between false alarms is at least the target for all but a share
    `1 - reference_confidence` of references, not only on average over them."""
    scores = np.asarray(in_control_scores, dtype=np.float64)
    if scores.size < 10:
        raise ValueError("at least 10 in-control scores are needed to calibrate a CUSUM")
    if target_arl < 10:
        raise ValueError("target_arl must be at least 10")
    if reference_confidence is None:
        cut = float(np.quantile(scores, 1.0 - tail, method="higher"))
        beta = float(np.mean(scores > cut))
        if beta <= 0.0:  # ties at the cut: fall back to "at or above"
            cut = math.nextafter(cut, -math.inf)
            beta = float(np.mean(scores > cut))
        beta = min(max(beta, 1.0 / scores.size), 0.5)
        bits = scores > cut

        def draw(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
            return bits[rng.integers(0, bits.size, size=shape)]
    else:
        cut, k = tail_cut(scores, tail)
        beta = min(exceedance_upper(k, scores.size, reference_confidence), 0.5)

        def draw(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
            return rng.random(shape) < beta

    rho = min(factor * beta, 0.5 + beta / 2)
    up, down = math.log(rho / beta), math.log((1 - rho) / (1 - beta))
    grid = np.linspace(0.25, math.log(target_arl) + 4.0, 72)
    steps = int(min(60_000, max(2_000, 60 * target_arl / streams)))
    alarms = _simulate(draw, up, down, grid, streams, steps, seed)
    total = streams * steps
    arl = np.where(alarms > 0, total / np.maximum(alarms, 1), np.inf)
    h, at = _interpolate(grid, arl, target_arl)
    return CusumDesign(cut, beta, rho, up, down, h, float(target_arl), at, total)


def _simulate(
    draw: Callable[[np.random.Generator, tuple[int, int]], np.ndarray],
    up: float,
    down: float,
    grid: np.ndarray,
    streams: int,
    steps: int,
    seed: int,
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    state = np.zeros((grid.size, streams))
    alarms = np.zeros(grid.size, dtype=np.int64)
    h = grid[:, None]
    block = 256
    for start in range(0, steps, block):
        draws = draw(rng, (min(block, steps - start), streams))
        increments = np.where(draws, up, down)  # [b, streams]
        for inc in increments:
            state += inc
            np.maximum(state, 0.0, out=state)
            fired = state >= h
            alarms += fired.sum(axis=1)
            state[fired] = 0.0
    return alarms


def _interpolate(grid: np.ndarray, arl: np.ndarray, target: float) -> tuple[float, float]:
    above = np.flatnonzero(arl >= target)
    if above.size == 0:
        return float(grid[-1]), float(arl[-1])
    j = int(above[0])
    if j == 0 or not np.isfinite(arl[j]):
        return float(grid[j]), float(arl[j])
    lo, hi = math.log(arl[j - 1]), math.log(arl[j])
    frac = (math.log(target) - lo) / (hi - lo) if hi > lo else 1.0
    return float(grid[j - 1] + frac * (grid[j] - grid[j - 1])), float(target)


class TailCusum:
    """The running chart for one signal."""

    def __init__(self, design: CusumDesign) -> None:
        self.design = design
        self.statistic = 0.0

    def update(self, score: float) -> tuple[bool, bool]:
        """Feed one score; returns `(exceeded, alarmed)`. The chart resets after an alarm."""
        d = self.design
        exceeded = score > d.cut
        self.statistic = max(0.0, self.statistic + (d.up if exceeded else d.down))
        if self.statistic >= d.threshold:
            self.statistic = 0.0
            return exceeded, True
        return exceeded, False

    def reset(self) -> None:
        self.statistic = 0.0
