"""Per-item novelty: one score per text, its calibration on the reference, and the tests on it.

The score of a text is its distance (1 - cosine) to the nearest text of the reference's
bank. The calibration scores are the reference's own texts' scores, the same way. The batch
tests, the streaming chart and the explanation all score texts this one way
(`NoveltyCalibration.score`).

Why per item: a new topic arriving as a trickle (a few percent of a window) barely moves
a window-level distance such as MMD² (which shrinks with the square of the share), but
each of its texts lands in the reference's far tail, so counting the window's texts beyond
the tail sees it in proportion to the share.

Calibration (`TestOptions.novelty_calibration`).
- "jackknife" (the default): the bank is the whole reference and each reference text's
  calibration score is its distance to the rest of the reference (leave one out). Every
  text of the reference serves both as bank and as calibration, so the tail cuts are read
  off twice as many scores as with a held-out half, and a handful of odd texts (a shouted
  question, a typo) no longer pushes every cut out on its own: they are ranks 1 to a few
  of the whole reference instead of the top of a half. Validity: put a new text with the
  reference and score each of the `n + 1` texts against the other `n`. Those scores are
  exchangeable when the new text comes from the reference's law, so the new text's score
  exceeds the `k`-th largest of the others with chance at most `k / (n + 1)`. The new
  text's score is exactly what the test computes (its distance to the reference); each
  reference text's leave-one-out score can only be larger than its score in that pool
  (one candidate neighbour fewer), so the cuts the test uses are at least as far out and
  the exceedance chance only smaller. Each score moves only when its own nearest
  neighbour is left out, so the cuts behave as order statistics of nearly independent
  scores, and the scan applies to them the bounds it uses for a held-out part (below); the
  per-reference false-alarm rates in docs/benchmarks/drift-power.md check that on real
  utterances.
- "split": a seeded share of the reference held out and scored against the rest (the
  bank), exactly as the bounds below assume; several splits (`novelty_splits`) are
  combined with Bonferroni.

The scan (the default `novelty` test). Which tail to count in is unknown: a topic far from
everything lands beyond the most extreme calibration score, one that borders the reference
only in its outer percent. So the test looks at several cuts at once, from the largest
calibration score out to the `novelty_scan_tail` tail (ranks `1, 2, 3, 5, ...`; wider
tails cost more in the joint bound than they gain on real utterances,
docs/benchmarks/drift-power.md), and takes the smallest of their binomial tail p-values:
Higher Criticism's idea (Donoho and Jin 2004, adaptive to an unknown share and strength)
in its exact, Berk-Jones-like form, whose null law is computed exactly rather than from a
normal approximation that fails in the far tail.

Valid for the reference in use (the PAC bound of `_stat_tests`, for all cuts at once).
Given the bank, held-out scores are iid, so the true exceedance chances `q_j` of the
`k_j`-th largest ones are the `k_j`-th smallest of `n` uniforms, jointly, whatever the
scores' law. `simultaneous_upper` finds bounds `b_j` (each a Beta quantile at one common
level, that level set by simulating uniform order statistics) with `P(q_j ≤ b_j for all j)
≥ reference_confidence`. On that event each count beyond cut `j` is at most the count of
uniforms below `b_j`; the statistic only grows with the counts, so its p-value under the
fixed `b_j` (`scan_p_value`, an exact recursion over the nested counts) is valid
conditional on the reference. Cost: one `[window, bank]` product, with jackknife one
`[reference, reference]` product to calibrate, and a recursion over a few dozen counts.

The smallest detectable share (`detectable_share`): for a window of `m` texts, the smallest
share of texts beyond every cut (a topic farther from the reference than its own texts)
that the scan detects with probability `power` at a given level, the other texts exceeding
each cut at the reference's expected rate `k_j / (n + 1)`, with the effect floor applied.
It comes from the reference's calibration alone, so a quiet verdict says what it rules out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ._mmd import StatResult, TestOptions, check_pair
from .errors import WindowTooSmall

__all__ = [
    "MIN_REFERENCE",
    "NOVELTY_METHOD",
    "NOVELTY_SINGLE_METHOD",
    "NoveltyCalibration",
    "detectable_share",
    "exceedance_upper",
    "fit_novelty",
    "fit_splits",
    "nearest",
    "nearest_other",
    "novelty_scores",
    "novelty_single_test",
    "novelty_test",
    "scan_p_value",
    "scan_ranks",
    "scan_splits",
    "scan_test",
    "simultaneous_upper",
    "split_reference",
    "tail_count_p_value",
    "tail_cut",
]


NOVELTY_METHOD = "nn_novelty_scan_conformal_conditional"
NOVELTY_SINGLE_METHOD = "nn_novelty_conformal_conditional_binomial"
MIN_REFERENCE = 4


def nearest(queries: np.ndarray, bank: np.ndarray, *, block: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """`(distance, index)`: for each query row its smallest `1 - cos` to a bank row and that row."""
    dist = np.empty(queries.shape[0], dtype=np.float32)
    index = np.empty(queries.shape[0], dtype=np.int64)
    for start in range(0, queries.shape[0], block):
        sims = queries[start : start + block] @ bank.T  # [b, bank]
        best = sims.argmax(axis=1)
        index[start : start + block] = best
        dist[start : start + block] = 1.0 - sims[np.arange(sims.shape[0]), best]
    return np.maximum(dist, 0.0), index


def nearest_other(rows: np.ndarray, *, block: int = 2048) -> np.ndarray:
    """For each row its smallest `1 - cos` to another row of `rows` (a duplicate scores 0):
    the leave-one-out score of a reference text against the rest of its reference."""
    n = rows.shape[0]
    dist = np.empty(n, dtype=np.float32)
    for start in range(0, n, block):
        sims = rows[start : start + block] @ rows.T  # [b, n]
        b = sims.shape[0]
        sims[np.arange(b), np.arange(start, start + b)] = -np.inf  # not itself
        dist[start : start + block] = 1.0 - sims.max(axis=1)
    return np.maximum(dist, 0.0)


def split_reference(n: int, calibration_fraction: float, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`(bank_rows, calibration_rows)` of a reference of `n` rows: a seeded random split,
    each side at least one row."""
    order = np.random.default_rng(seed).permutation(n)
    n_cal = min(max(round(n * calibration_fraction), 1), n - 1)
    return np.sort(order[n_cal:]), np.sort(order[:n_cal])


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


def scan_ranks(n: int, widest_tail: float) -> tuple[int, ...]:
    """The ranks of the cuts the scan looks at: `1, 2, 3, 5, 8, ...` (about ×1.5 apart) up to
    `⌊widest_tail · (n + 1)⌋`, at least the first."""
    top = min(max(1, math.floor(widest_tail * (n + 1))), n)
    ranks = {1}
    value = 1.0
    while True:
        value *= 1.5
        k = round(value)
        if k > top:
            break
        ranks.add(k)
    ranks.add(top)
    return tuple(sorted(ranks))


@functools.lru_cache(maxsize=64)  # a pure function of its arguments, asked again for every window
def simultaneous_upper(
    n: int, ranks: tuple[int, ...], confidence: float, *, draws: int = 20_000, seed: int = 0
) -> tuple[float, ...]:
    """Bounds `b_j` with `P(U_(k_j) ≤ b_j for every j) ≥ confidence` for the order statistics
    `U_(1) ≤ U_(2) ≤ ...` of `n` uniforms: `b_j` is the `Beta(k_j, n + 1 - k_j)` quantile at
    one common level, the level chosen from `draws` simulated samples (distribution-free:
    the same for every reference of `n` calibration scores)."""
    from scipy.stats import beta

    ks = np.asarray(ranks)
    if ks.size == 1:
        return (exceedance_upper(int(ks[0]), n, confidence),)
    rng = np.random.default_rng(seed)
    top = int(ks[-1])
    # U_(k) = (E_1 + ... + E_k) / (E_1 + ... + E_{n+1}), E iid exponential
    heads = np.cumsum(rng.standard_exponential((draws, top)), axis=1)  # [draws, top]
    total = heads[:, -1] + rng.standard_gamma(n + 1 - top, draws)
    u = heads[:, ks - 1] / total[:, None]  # [draws, J]
    level = beta.cdf(u, ks, n + 1 - ks).max(axis=1)  # how extreme each sample is, at its worst cut
    common = float(np.quantile(level, confidence, method="higher"))
    return tuple(float(b) for b in beta.ppf(common, ks, n + 1 - ks))


def _none_reach(limits: np.ndarray, size: int, upper: np.ndarray) -> float:
    """`P(N_j < limits_j for every j)` for the nested counts `N_j = #{V_i < upper_j}` of
    `size` iid uniforms, `upper` increasing: a recursion over the counts."""
    from scipy.stats import binom

    cap = int(limits.max())
    if int(limits.min()) <= 0:
        return 0.0
    states = np.arange(cap)  # N_j, held below limits_j
    prob = np.zeros(cap)
    lim0 = int(limits[0])
    prob[:lim0] = binom.pmf(states[:lim0], size, upper[0])
    for j in range(1, upper.size):
        lim = int(limits[j])
        r = (upper[j] - upper[j - 1]) / (1.0 - upper[j - 1])  # chance to pass cut j given not cut j-1
        a = states[:, None]
        step = binom.pmf(states[None, :lim] - a, size - a, r)  # [from, to]
        prob = np.concatenate([prob @ step, np.zeros(cap - lim)])
    return float(prob.sum())


def _limits(threshold: float, size: int, upper: np.ndarray) -> np.ndarray:
    """Per cut, the smallest count whose binomial tail p-value is at most `threshold`."""
    from scipy.stats import binom

    counts = np.arange(size + 2)
    sf = binom.sf(counts[None, :] - 1, size, upper[:, None])  # P(N ≥ c)  [J, size + 2]
    sf[:, -1] = 0.0  # a count above the window: never reached
    return np.argmax(sf <= threshold, axis=1)


def scan_p_value(counts: np.ndarray, size: int, upper: tuple[float, ...]) -> tuple[float, int]:
    """`(p, j)`: the scan's p-value for `counts` beyond each cut (nested, as the cuts) in a
    window of `size`, valid when each cut's exceedance chance is at most `upper_j`; `j` is
    the cut with the smallest binomial tail p-value."""
    from scipy.stats import binom

    b = np.asarray(upper, dtype=np.float64)
    c = np.asarray(counts)
    single = np.where(c > 0, binom.sf(c - 1, size, b), 1.0)
    j = int(np.argmin(single))
    observed = float(single[j])
    if observed >= 1.0:
        return 1.0, j
    p = 1.0 - _none_reach(_limits(observed * (1 + 1e-9), size, b), size, b)
    return float(min(1.0, max(p, observed))), j


@dataclass(frozen=True, eq=False)
class NoveltyCalibration:
    """A reference's bank and its calibration scores, with the scan's cuts and bounds."""

    bank: np.ndarray  # [n_bank, D] unit rows
    bank_rows: np.ndarray  # the bank's row indices in the reference
    calibration: np.ndarray  # [n_cal] held-out (or leave-one-out) scores, descending
    ranks: tuple[int, ...]  # k_j
    cuts: tuple[float, ...]  # the k_j-th largest calibration score (decreasing in j)
    upper: tuple[float, ...]  # b_j: simultaneous upper bounds of the exceedance chances
    n_reference: int  # texts in the reference (bank and held-out, or the whole with jackknife)

    def score(self, rows: np.ndarray) -> np.ndarray:
        """Each row's distance to the nearest bank text `[N]`."""
        return nearest(rows, self.bank)[0]

    def counts(self, scores: np.ndarray) -> np.ndarray:
        """How many scores lie strictly beyond each cut `[J]`."""
        return np.asarray([int(np.count_nonzero(scores > c)) for c in self.cuts])

    @property
    def n(self) -> int:
        return int(self.calibration.size)


def fit_novelty(reference: np.ndarray, options: TestOptions, *, split: int = 0) -> NoveltyCalibration:
    """Calibrate the scan on unit-row `reference`, as `options.novelty_calibration` says.

    "jackknife": the bank is the whole reference and each reference text's score is its
    distance to the rest of it. "split": split the reference (seed `options.seed + split`),
    score the held-out part against the bank; the bounds then hold jointly over every split
    at `reference_confidence` (each split gets its share of `1 - reference_confidence`).
    Either way the cuts are the held-out (or leave-one-out) scores' largest and the bounds
    `simultaneous_upper`'s."""
    if reference.shape[0] < MIN_REFERENCE:
        raise WindowTooSmall("reference", reference.shape[0], MIN_REFERENCE)
    if options.novelty_calibration == "jackknife":
        bank_rows = np.arange(reference.shape[0])
        bank = reference
        scores = nearest_other(reference)
        confidence = options.reference_confidence
    else:
        seed = options.seed + split
        bank_rows, cal_rows = split_reference(reference.shape[0], options.calibration_fraction, seed=seed)
        bank = reference[bank_rows]
        scores = nearest(reference[cal_rows], bank)[0]
        confidence = 1.0 - (1.0 - options.reference_confidence) / options.novelty_splits
    cal = np.sort(scores.astype(np.float64))[::-1]
    ranks = scan_ranks(cal.size, options.novelty_scan_tail)
    upper = simultaneous_upper(cal.size, ranks, confidence, seed=options.seed)
    cuts = tuple(float(cal[k - 1]) for k in ranks)
    return NoveltyCalibration(bank, bank_rows, cal, ranks, cuts, upper, reference.shape[0])


def fit_splits(reference: np.ndarray, options: TestOptions) -> tuple[NoveltyCalibration, ...]:
    """One calibration per split (`options.novelty_splits`; one with jackknife calibration)."""
    if options.novelty_calibration == "jackknife":
        return (fit_novelty(reference, options),)
    return tuple(fit_novelty(reference, options, split=i) for i in range(options.novelty_splits))


def novelty_scores(
    reference: np.ndarray, current: np.ndarray, options: TestOptions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(calibration_scores, current_scores, bank_rows)` for unit-row reference and current."""
    bank_rows, cal_rows = split_reference(reference.shape[0], options.calibration_fraction, seed=options.seed)
    bank = reference[bank_rows]
    cal_scores, _ = nearest(reference[cal_rows], bank)
    cur_scores, _ = nearest(current, bank)
    return cal_scores, cur_scores, bank_rows


def _checked(reference: np.ndarray, current: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, y = check_pair(reference, current)
    if x.shape[0] < MIN_REFERENCE:
        raise WindowTooSmall("reference", x.shape[0], MIN_REFERENCE)
    if y.shape[0] < 1:
        raise WindowTooSmall("current", y.shape[0], 1)
    return x, y


def novelty_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    """The scan over cuts, on each split of the reference, Bonferroni across the splits.
    Statistic: the count beyond the deciding cut of the deciding split; effect size
    (`score`): that split's largest excess share over its cuts (a cut's count share minus
    the share expected there, `k_j / (n + 1)`)."""
    x, y = _checked(reference, current)
    return scan_splits(fit_splits(x, options), y)


def scan_splits(calibrations: tuple[NoveltyCalibration, ...], current: np.ndarray) -> StatResult:
    results = [scan_test(c, current) for c in calibrations]
    best = min(results, key=lambda r: (r.p_value, -r.score))
    p = min(1.0, len(results) * best.p_value)
    return StatResult(
        "novelty", NOVELTY_METHOD, best.statistic, best.score, p, best.n_reference, best.n_current, 0
    )


def scan_test(calibration: NoveltyCalibration, current: np.ndarray) -> StatResult:
    """The scan on one split."""
    counts = calibration.counts(calibration.score(current))
    m = current.shape[0]
    p, j = scan_p_value(counts, m, calibration.upper)
    score = float((counts / m - np.asarray(calibration.ranks) / (calibration.n + 1)).max())
    return StatResult(
        "novelty", NOVELTY_METHOD, float(counts[j]), float(score), p, calibration.n_reference, m, 0
    )


def novelty_single_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    """One cut, the `novelty_tail` tail of the held-out scores (the test before the scan)."""
    x, y = _checked(reference, current)
    cal, cur = novelty_scores(x, y, options)[:2]
    cut, k = tail_cut(cal, options.novelty_tail)
    beyond = int(np.count_nonzero(cur > cut))
    q_upper = exceedance_upper(k, cal.size, options.reference_confidence)
    p_value = tail_count_p_value(beyond, cur.size, q_upper)
    score = beyond / cur.size - k / (cal.size + 1)
    return StatResult(
        "novelty_single", NOVELTY_SINGLE_METHOD, float(beyond), score, p_value, x.shape[0], y.shape[0], 0
    )


def detectable_share(
    calibration: NoveltyCalibration,
    window: int,
    *,
    level: float,
    floor: float,
    power: float = 0.9,
    draws: int = 4000,
    seed: int = 0,
) -> float | None:
    """The smallest share of a `window`-text window, texts beyond every cut, that the scan
    on this one split detects (p-value at most `level`, effect at least `floor`) with
    probability `power`; None when even a whole window of them would not be. With several
    splits, pass `level / splits`: one split alone at its Bonferroni share (the others can
    only add detections, so the figure errs on the side of a larger share)."""
    b = np.asarray(calibration.upper)
    limits = _limits(_critical(level, window, b), window, b)  # reject iff some count reaches its limit
    expected = np.asarray(calibration.ranks) / (calibration.n + 1)  # home texts' exceedance chance
    widths = np.diff(np.concatenate([[0.0], expected, [1.0]]))
    ranks_share = np.asarray(calibration.ranks) / (calibration.n + 1)
    rng = np.random.default_rng(seed)

    def detected(new: int) -> float:
        home = rng.multinomial(window - new, widths, size=draws)[:, :-1].cumsum(axis=1)  # [draws, J]
        counts = home + new
        reach = counts >= limits  # the cuts whose own p-value is small enough
        if not reach.any():
            return 0.0
        effect = (counts / window - ranks_share).max(axis=1)  # as `scan_test` scores it
        return float(np.mean(reach.any(axis=1) & (effect >= floor)))

    lo, hi = 0, window
    if detected(hi) < power:
        return None
    while hi - lo > 1:  # detection rises with the count of new texts
        mid = (lo + hi) // 2
        if detected(mid) >= power:
            hi = mid
        else:
            lo = mid
    return hi / window


def _critical(level: float, size: int, upper: np.ndarray) -> float:
    """The largest single-cut p-value threshold at which the scan's p-value is at most `level`."""
    from scipy.stats import binom

    counts = np.arange(1, size + 1)
    candidates = np.unique(binom.sf(counts[None, :] - 1, size, upper[:, None]).ravel())
    lo, hi = 0, candidates.size - 1  # p-value rises with the threshold: bisect on the candidates
    best = 0.0
    while lo <= hi:
        mid = (lo + hi) // 2
        t = float(candidates[mid])
        p = 1.0 - _none_reach(_limits(t * (1 + 1e-9), size, upper), size, upper)
        if p <= level:
            best, lo = t, mid + 1
        else:
            hi = mid - 1
    return best
