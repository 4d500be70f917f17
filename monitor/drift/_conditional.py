"""Bounds that hold for the one reference a team keeps, not only on average over references.

A test that compares every new window with the same reference is only as good as that
reference: a split-conformal or two-sample p-value is exact *marginally* (averaged over
references and seeds), but with one fixed reference its false-alarm rate can sit well above
alpha, window after window. The tests here therefore bound the reference's own sampling
error first, at confidence `reference_confidence` (`1 - δ`), and then test the current
window *given* the reference against that bound. For all but a share δ of (reference, seed)
pairs, the false-alarm rate conditional on the pair is then at most the nominal level
(a "training-conditional" or PAC guarantee).

Tail exceedance (novelty, streaming charts). Let `c` be the `k`-th largest of `n`
calibration scores, drawn independently of the scoring function (the bank). For a new
score `S` from the same law, `q = P(S > c | reference)` is distributed as (or, with ties,
stochastically below) `Beta(k, n + 1 - k)` over references, whatever the scores' law
(the distribution of the k-th order statistic of uniforms). So `q ≤ q⁺ = Beta⁻¹(1 - δ)`
for a share at least 1 - δ of references, and the count of current scores above `c` is
stochastically below `Binomial(n_current, q⁺)`.

Mean rank (relevance). For a current value `y`, `G(y)` is the share of reference values
above it (ties count half). Given the reference, the window's mean `W` of `G` has mean
`θ = (1/m) Σ F(r_i)`, a mean of `m` uniforms: `θ ≤ 1/2 + z₁₋δ / sqrt(12 m)` for a share
1 - δ of references; `G(Y)` has variance at most about 1/12 (less with ties).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["exceedance_upper", "mean_rank_p_value", "tail_count_p_value", "tail_cut"]


def tail_cut(calibration: np.ndarray, tail: float) -> tuple[float, int]:
    """`(cut, k)`: the `k`-th largest calibration score, `k = max(1, ⌊tail · (n + 1)⌋)`.

    New scores count as exceedances when strictly above `cut`; with ties that only makes
    the exceedance probability smaller than the continuous case's."""
    scores = np.sort(np.asarray(calibration, dtype=np.float64).ravel())
    n = scores.size
    if n == 0:
        raise ValueError("no calibration scores")
    k = min(max(1, math.floor(tail * (n + 1))), n)
    return float(scores[n - k]), k


def exceedance_upper(k: int, n: int, confidence: float) -> float:
    """`q⁺`: the `confidence` quantile of `Beta(k, n + 1 - k)`, the law of the chance that a
    new score exceeds the `k`-th largest of `n` calibration scores."""
    from scipy.stats import beta  # scipy.stats is slow to import: only when testing

    return float(beta.ppf(confidence, k, n + 1 - k))


def tail_count_p_value(count: int, size: int, q_upper: float) -> float:
    """`P(Binomial(size, q⁺) ≥ count)`: valid for the reference whenever its true
    exceedance chance is at most `q⁺`."""
    from scipy.stats import binom

    if count <= 0:
        return 1.0
    return float(min(1.0, binom.sf(count - 1, size, q_upper)))


def mean_rank_p_value(reference: np.ndarray, current: np.ndarray, confidence: float) -> tuple[float, float]:
    """`(W, p)`: the current window's mean share of reference values above each current
    value (1/2 when nothing changed), and the one-sided p-value of "current is lower"
    conditional on the reference (normal approximation, reference's error bounded first)."""
    from scipy.stats import norm

    ref = np.sort(np.asarray(reference, dtype=np.float64).ravel())
    cur = np.asarray(current, dtype=np.float64).ravel()
    m, k = ref.size, cur.size
    below = np.searchsorted(ref, cur, side="left")  # reference values < y
    not_above = np.searchsorted(ref, cur, side="right")  # reference values <= y
    g = (m - not_above + 0.5 * (not_above - below)) / m  # share above y, ties half  [k]
    w = float(g.mean())
    theta_upper = 0.5 + float(norm.ppf(confidence)) / math.sqrt(12.0 * m)
    z = (w - theta_upper) / math.sqrt(1.0 / (12.0 * k))
    return w, float(norm.sf(z))
