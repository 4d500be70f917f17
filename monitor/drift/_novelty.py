"""Nearest-neighbour novelty test, calibrated by exchangeability (split conformal).

The reference is split once (seeded) into a bank and a held-out calibration part. Every
held-out reference text and every current text gets the same score: its distance
(1 - cosine) to the nearest bank text. If the current window comes from the reference's
distribution, the pooled scores are exchangeable, so which of them belong to the current
window is a uniformly random subset. The statistic counts current texts among the pooled
upper tail (the top `novelty_tail` share of the pooled scores, ties included); its null
law is exactly hypergeometric, which gives the p-value in closed form. (A binomial test
against a quantile estimated from the reference ignores that estimate's error, shared by
every current text, and over-rejects badly.)

Effect size (`score`): the share of current texts in the tail minus the share of held-out
reference texts in it, i.e. the excess share of novel texts.
"""

from __future__ import annotations

import numpy as np

from ._kernel import check_pair
from ._neighbours import nearest, split_reference
from ._stat import StatResult, TestOptions
from .errors import WindowTooSmall

__all__ = ["novelty_scores", "novelty_test"]

METHOD = "nn_novelty_conformal_hypergeometric"
MIN_REFERENCE = 4


def novelty_scores(
    reference: np.ndarray, current: np.ndarray, options: TestOptions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(calibration_scores, current_scores, bank_rows)` for unit-row reference and current."""
    bank_rows, cal_rows = split_reference(reference.shape[0], options.calibration_fraction, seed=options.seed)
    bank = reference[bank_rows]
    cal_scores, _ = nearest(reference[cal_rows], bank)
    cur_scores, _ = nearest(current, bank)
    return cal_scores, cur_scores, bank_rows


def novelty_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    from scipy.stats import hypergeom  # scipy.stats is slow to import: only when testing

    x, y = check_pair(reference, current)
    if x.shape[0] < MIN_REFERENCE:
        raise WindowTooSmall("reference", x.shape[0], MIN_REFERENCE)
    if y.shape[0] < 1:
        raise WindowTooSmall("current", y.shape[0], 1)
    cal, cur = novelty_scores(x, y, options)[:2]
    pooled = np.concatenate([cal, cur])
    cut = np.quantile(pooled, 1.0 - options.novelty_tail, method="higher")
    in_tail = int(np.count_nonzero(pooled >= cut))  # depends on the pooled multiset only
    current_in_tail = int(np.count_nonzero(cur >= cut))
    p_value = float(hypergeom.sf(current_in_tail - 1, pooled.size, cur.size, in_tail))
    score = current_in_tail / cur.size - (in_tail - current_in_tail) / cal.size
    return StatResult(
        "novelty", METHOD, float(current_in_tail), score, min(1.0, p_value), x.shape[0], y.shape[0], 0
    )
