"""Streaming drift for the service: per-request novelty and relevance into CUSUM charts.

Novelty of a request is its prompt's distance (1 - cosine) to the nearest text of the
reference's bank: the batch novelty scan's per-item score, from the same
`NoveltyCalibration` (with the default jackknife calibration the bank is the whole
reference); the chart's in-control scores are the scan's calibration scores (each
reference text's distance to the rest of the reference). Relevance (when the reference has
responses) is charted on its negative, so a drop is the anomalous side. Both charts are
designed for the upper `reference_confidence` bound of their in-control exceedance rate
(`design_cusum`), so the run length between false alarms holds for the reference in use,
not only on average over references.
With both charts each gets `2 × target_arl` (alone, the novelty chart gets `target_arl`),
so false alarms of either come on average about `target_arl` requests apart (union bound
on the alarm rates).

A Bernoulli CUSUM on tail exceedances, its threshold calibrated by simulation.

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

from ._mmd import TestOptions, as_unit_rows
from ._novelty import exceedance_upper, fit_novelty, tail_cut
from ._windows import EmbeddedWindow

__all__ = ["CusumDesign", "StreamUpdate", "StreamingDetector", "TailCusum", "design_cusum"]


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
    them). With a confidence, they are a sample from it (the reference's calibration scores):
    the cut is their `k`-th largest and the chart is designed for `β⁺`, the upper
    `reference_confidence` bound of the chance a new score exceeds that cut (`exceedance_upper`),
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


@dataclass(frozen=True)
class StreamUpdate:
    index: int  # 0-based position of the request in the stream
    novelty: float  # distance to the nearest reference (bank) text
    novel: bool  # beyond the novelty chart's cut
    relevance: float | None  # prompt-response cosine, None without a response
    novelty_statistic: float  # CUSUM value after this request (0 right after an alarm)
    relevance_statistic: float | None
    alarm: bool
    signals: tuple[str, ...]  # which charts alarmed: "novelty", "relevance"


class StreamingDetector:
    def __init__(
        self,
        reference: EmbeddedWindow,
        *,
        target_arl: float = 2000.0,
        tail: float = 0.05,
        factor: float = 3.0,
        options: TestOptions | None = None,
        min_responses: int = 20,
    ) -> None:
        opts = options or TestOptions()
        # the batch test's per-item scores: the same bank, the same calibration scores
        self.calibration = fit_novelty(as_unit_rows(reference.prompt_embeddings, "reference"), opts)
        cal_scores = self.calibration.calibration
        charts = 2 if len(reference.relevance) >= min_responses else 1
        per_chart = charts * target_arl  # union bound: alarm rates add up across charts
        self.novelty_design: CusumDesign = design_cusum(
            cal_scores,
            tail=tail,
            factor=factor,
            target_arl=per_chart,
            seed=opts.seed,
            reference_confidence=opts.reference_confidence,
        )
        self.relevance_design: CusumDesign | None = None
        if charts == 2:
            self.relevance_design = design_cusum(
                -reference.relevance,
                tail=tail,
                factor=factor,
                target_arl=per_chart,
                seed=opts.seed + 1,
                reference_confidence=opts.reference_confidence,
            )
        self.target_arl = float(target_arl)
        self._novelty = TailCusum(self.novelty_design)
        self._relevance = TailCusum(self.relevance_design) if self.relevance_design else None
        self._index = 0

    def observe(
        self, prompt_embedding: np.ndarray, response_embedding: np.ndarray | None = None
    ) -> StreamUpdate:
        """One request: its prompt embedding `[D]` and, when it has one, its response's."""
        p = as_unit_rows(np.asarray(prompt_embedding).reshape(1, -1), "prompt embedding")
        distance = float(self.calibration.score(p)[0])
        novel, novelty_alarm = self._novelty.update(distance)
        relevance: float | None = None
        relevance_alarm = False
        if response_embedding is not None:
            r = as_unit_rows(np.asarray(response_embedding).reshape(1, -1), "response embedding")
            relevance = float(p[0] @ r[0])
            if self._relevance is not None:
                _, relevance_alarm = self._relevance.update(-relevance)
        signals = tuple(
            name for name, fired in (("novelty", novelty_alarm), ("relevance", relevance_alarm)) if fired
        )
        update = StreamUpdate(
            index=self._index,
            novelty=distance,
            novel=novel,
            relevance=relevance,
            novelty_statistic=self._novelty.statistic,
            relevance_statistic=self._relevance.statistic if self._relevance is not None else None,
            alarm=bool(signals),
            signals=signals,
        )
        self._index += 1
        return update

    def observe_many(
        self, prompt_embeddings: np.ndarray, response_embeddings: np.ndarray | None = None
    ) -> tuple[StreamUpdate, ...]:
        """Several requests in order (`[N, D]`, responses row-for-row or None)."""
        prompts = np.asarray(prompt_embeddings)
        if response_embeddings is None:
            return tuple(self.observe(p) for p in prompts)
        return tuple(
            self.observe(p, r) for p, r in zip(prompts, np.asarray(response_embeddings), strict=True)
        )

    def reset(self) -> None:
        self._novelty.reset()
        if self._relevance is not None:
            self._relevance.reset()
