"""The tests a detector runs besides MMD, their registry, and `DetectorConfig` (which tests,
at what level, with which effect floors).

- Conditional calibration: Bounds that hold for the one reference a team keeps, not only on average over references.

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
- Novelty (`_novelty`, re-exported here): the nearest-neighbour tests on the same bound.
  `novelty_single` counts beyond one cut, the `novelty_tail` tail of the held-out scores,
  against `Binomial(n_current, q⁺)`; `novelty` (the default) scans several cuts at once with
  bounds that hold for all of them together.
- Relevance: Prompt-response relevance: the cosine between a prompt and its response, per request
and as a windowed distribution. Relevance drop: are the current window's prompt-response cosines lower than the reference's?

One-sided rank test conditional on the reference (`mean_rank_p_value`): the
statistic is the mean, over current requests, of the share of reference cosines above each
current cosine (1/2 without a change); the reference's own sampling error is bounded first
(at `reference_confidence`), so the level holds for the reference in use, not only on
average over references as a plain Mann-Whitney test's does. Effect size (`score`) is the
drop of the mean cosine, reference minus current.
- Holm's step-down adjustment, weighted by each test's share of alpha: family-wise error at
  alpha under any dependence.
- The registry: the tests a detector can run on an embedded field, by name (an explicit
  dict); an unknown name lists the valid ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from ._mmd import StatResult, StatTest, TestOptions, mmd_exact_test, mmd_rff_test, mmd_test
from ._novelty import (
    exceedance_upper,
    nearest,
    novelty_scores,
    novelty_single_test,
    novelty_test,
    split_reference,
    tail_count_p_value,
    tail_cut,
)
from .errors import UnknownTest, WindowTooSmall

__all__ = [
    "DEFAULT_EFFECT_FLOORS",
    "DEFAULT_TEST_WEIGHTS",
    "RELEVANCE_BUCKETS",
    "STAT_TESTS",
    "DetectorConfig",
    "RelevanceComparison",
    "RelevanceSummary",
    "exceedance_upper",
    "get_test",
    "holm_adjust",
    "mean_rank_p_value",
    "nearest",
    "novelty_scores",
    "novelty_single_test",
    "novelty_test",
    "relevance",
    "relevance_drop_test",
    "split_reference",
    "summarize_relevance",
    "tail_count_p_value",
    "tail_cut",
]


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


# Histogram edges shared by the summary and the Prometheus histogram.
RELEVANCE_BUCKETS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))


def relevance(prompt_embeddings: np.ndarray, response_embeddings: np.ndarray) -> np.ndarray:
    """Row-wise cosine of unit rows: `[N]` float32."""
    return np.einsum("ij,ij->i", prompt_embeddings, response_embeddings).astype(np.float32)


@dataclass(frozen=True)
class RelevanceSummary:
    n: int
    mean: float | None  # None for an empty window
    std: float | None
    p05: float | None
    p25: float | None
    p50: float | None
    p75: float | None
    p95: float | None
    bucket_edges: tuple[float, ...]  # counts[i] covers [edges[i], edges[i+1]); the ends take the tails
    bucket_counts: tuple[int, ...]


def summarize_relevance(values: np.ndarray) -> RelevanceSummary:
    v = np.asarray(values, dtype=np.float64)
    edges = np.asarray(RELEVANCE_BUCKETS)
    clipped = np.clip(v, edges[0], edges[-1])
    counts, _ = np.histogram(clipped, bins=edges)
    if v.size == 0:
        return RelevanceSummary(
            0, None, None, None, None, None, None, None, RELEVANCE_BUCKETS, tuple(int(c) for c in counts)
        )
    q = [float(x) for x in np.quantile(v, [0.05, 0.25, 0.5, 0.75, 0.95])]
    return RelevanceSummary(
        n=int(v.size),
        mean=float(v.mean()),
        std=float(v.std()),
        p05=q[0],
        p25=q[1],
        p50=q[2],
        p75=q[3],
        p95=q[4],
        bucket_edges=RELEVANCE_BUCKETS,
        bucket_counts=tuple(int(c) for c in counts),
    )


@dataclass(frozen=True)
class RelevanceComparison:
    reference: RelevanceSummary
    current: RelevanceSummary


RELEVANCE_DROP_METHOD = "mean_rank_one_sided_reference_conditional"


def relevance_drop_test(
    reference: np.ndarray, current: np.ndarray, options: TestOptions | None = None
) -> StatResult:
    """`reference` and `current` are 1-D arrays of per-request relevance."""
    opts = options or TestOptions()
    x = np.asarray(reference, dtype=np.float64).ravel()
    y = np.asarray(current, dtype=np.float64).ravel()
    if x.size < 2:
        raise WindowTooSmall("reference relevance", int(x.size), 2)
    if y.size < 2:
        raise WindowTooSmall("current relevance", int(y.size), 2)
    w, p = mean_rank_p_value(x, y, opts.reference_confidence)
    return StatResult(
        "relevance_drop", RELEVANCE_DROP_METHOD, w, float(x.mean() - y.mean()), p, x.size, y.size, 0
    )


def holm_adjust(p_values: Sequence[float], weights: Sequence[float] | None = None) -> tuple[float, ...]:
    """Adjusted p-values in the input order: reject test i at level alpha iff adjusted[i] < alpha.

    Holm's step-down procedure, weighted (Holm 1979) when `weights` are given: test `i`
    gets the share `w_i / Σ w` of alpha at the first step, and what a rejected test held
    passes on to the rest. The smallest adjusted value is `min p_i · Σ w / w_i` (weighted
    Bonferroni), so "any test rejects" has false-alarm probability at most alpha when
    every null holds, under any dependence between the tests. Equal weights are Holm's."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    if m == 0:
        return ()
    w = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (m,) or not (w > 0).all():
        raise ValueError("one positive weight per p-value")
    order = np.lexsort((np.arange(m), p / w))  # by p / w, ties in input order
    remaining = np.cumsum(w[order][::-1])[::-1]  # the weight still in play at each step
    stepped = np.maximum.accumulate(remaining * p[order] / w[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return tuple(float(v) for v in adjusted)


STAT_TESTS: Mapping[str, StatTest] = MappingProxyType(
    {
        "mmd": mmd_test,  # exact kernel or random features, by size
        "mmd_exact": mmd_exact_test,
        "mmd_rff": mmd_rff_test,
        "novelty": novelty_test,  # the scan over several tail cuts
        "novelty_single": novelty_single_test,  # one cut (the test before the scan)
    }
)


def get_test(name: str) -> StatTest:
    try:
        return STAT_TESTS[name]
    except KeyError:
        raise UnknownTest(name, tuple(sorted(STAT_TESTS))) from None


# Effect sizes below these are "trivial" and never declared drift, however small the p.
# MMD² in kernel units: on MiniLM / Banking77 a 10% admixture of a new topic gives about
# 7e-4 and MMD² grows with the square of the admixture, so 1e-4 is roughly a 4% admixture.
# Novelty: excess share of current texts in the pooled tail (2 percentage points).
# Relevance: drop of the mean prompt-response cosine (0.05).
DEFAULT_EFFECT_FLOORS: Mapping[str, float] = MappingProxyType(
    {
        "mmd": 1e-4,
        "mmd_exact": 1e-4,
        "mmd_rff": 1e-4,
        "novelty": 0.02,
        "novelty_single": 0.02,
        "relevance_drop": 0.05,
    }
)


# Each test's share of alpha in the report's weighted Holm (relative weights). The novelty
# scan and the relevance test hold their level for the reference in use (their bounds
# come first); MMD's permutation p-value holds it only on average over references, and a
# reference that happens to sit off its own population's centre makes MMD alarm on
# same-distribution windows more often than its level, window after window. Giving MMD
# the smaller share shrinks that excess (without bounding it) and leaves the novelty
# scan, which carries small shares of new texts, most of alpha; MMD still decides on
# broad shifts of the mix, where its p-value is far below any of these shares.
DEFAULT_TEST_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        "mmd": 1.0,
        "mmd_exact": 1.0,
        "mmd_rff": 1.0,
        "novelty": 3.0,
        "novelty_single": 3.0,
        "relevance_drop": 2.0,
    }
)


@dataclass(frozen=True)
class DetectorConfig:
    alpha: float = 0.05  # family-wise: weighted Holm across every test and field of a report
    tests: tuple[str, ...] = ("mmd", "novelty")  # run on prompts and on responses
    relevance_test: bool = True  # one-sided relevance drop when both windows have responses
    effect_floors: Mapping[str, float] = field(default_factory=lambda: DEFAULT_EFFECT_FLOORS)
    test_weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_TEST_WEIGHTS)
    options: TestOptions = field(default_factory=TestOptions)
    min_reference: int = 20
    min_current: int = 5
    n_clusters: int | None = None  # None: min(20, max(2, n_reference // 50))
    examples: int = 5
    novelty_quantile: float = 0.99  # the explanation's novelty rate: beyond the reference's 1% tail
    projection_points: int = 400  # per window, in the 2-D view
    explain_max_points: int = 2000  # witness and clusters on at most this many texts per window

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError("alpha must be in (0, 1)")
        if not self.tests:
            raise ValueError("at least one test is needed")
        for name in self.tests:
            if name not in STAT_TESTS:
                raise UnknownTest(name, tuple(sorted(STAT_TESTS)))
        if not 0.5 < self.novelty_quantile < 1.0:
            raise ValueError("novelty_quantile must be in (0.5, 1)")
        if any(w <= 0 for w in self.test_weights.values()):
            raise ValueError("test_weights must be positive")
        if self.min_reference < 4 or self.min_current < 2:
            raise ValueError("min_reference must be at least 4 and min_current at least 2")

    def floor(self, test: str) -> float:
        return float(self.effect_floors.get(test, 0.0))

    def weight(self, test: str) -> float:
        """The test's relative share of alpha in the report's weighted Holm (1 if unnamed)."""
        return float(self.test_weights.get(test, 1.0))

    def first_step_level(self, test: str, family: Sequence[str]) -> float:
        """The level the weighted Holm holds `test` to at its first step in `family` (the
        names of every test in the report): the least it asks of that test's p-value."""
        return self.alpha * self.weight(test) / sum(self.weight(t) for t in family)
