"""Nearest-neighbour novelty test, calibrated for the reference in use (split conformal, PAC).

The reference is split once (seeded) into a bank and a held-out calibration part. Every
held-out reference text and every current text gets the same score: its distance
(1 - cosine) to the nearest bank text. The cut is the `k`-th largest held-out score
(`k ≈ novelty_tail · (n_cal + 1)`), and the statistic counts current texts strictly
beyond it.

Given the reference (bank and held-out part fixed), a current text from the reference's
distribution lands beyond the cut with some chance `q`; over references `q` follows
`Beta(k, n_cal + 1 - k)` (see `_conditional`), so `q ≤ q⁺`, that law's
`reference_confidence` quantile, for all but a share `1 - reference_confidence` of
references. The p-value is the binomial tail at `q⁺`: it is valid conditional on the
reference, not only on average. (The earlier test counted current texts in the *pooled*
tail with a hypergeometric law: exact over random references and splits, but with one
unlucky reference and seed it raised false alarms on about every third window.)

Effect size (`score`): the share of current texts beyond the cut minus the share expected
without drift (`k / (n_cal + 1)`), i.e. the excess share of novel texts.
"""

from __future__ import annotations

import numpy as np

from ._conditional import exceedance_upper, tail_count_p_value, tail_cut
from ._kernel import check_pair
from ._neighbours import nearest, split_reference
from ._stat import StatResult, TestOptions
from .errors import WindowTooSmall

__all__ = ["novelty_scores", "novelty_test"]

NOVELTY_METHOD = "nn_novelty_conformal_conditional_binomial"
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
    x, y = check_pair(reference, current)
    if x.shape[0] < MIN_REFERENCE:
        raise WindowTooSmall("reference", x.shape[0], MIN_REFERENCE)
    if y.shape[0] < 1:
        raise WindowTooSmall("current", y.shape[0], 1)
    cal, cur = novelty_scores(x, y, options)[:2]
    cut, k = tail_cut(cal, options.novelty_tail)
    beyond = int(np.count_nonzero(cur > cut))
    q_upper = exceedance_upper(k, cal.size, options.reference_confidence)
    p_value = tail_count_p_value(beyond, cur.size, q_upper)
    score = beyond / cur.size - k / (cal.size + 1)
    return StatResult("novelty", NOVELTY_METHOD, float(beyond), score, p_value, x.shape[0], y.shape[0], 0)
