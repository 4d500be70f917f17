"""Relevance drop: are the current window's prompt-response cosines lower than the reference's?

One-sided rank test conditional on the reference (`_conditional.mean_rank_p_value`): the
statistic is the mean, over current requests, of the share of reference cosines above each
current cosine (1/2 without a change); the reference's own sampling error is bounded first
(at `reference_confidence`), so the level holds for the reference in use, not only on
average over references as a plain Mann-Whitney test's does. Effect size (`score`) is the
drop of the mean cosine, reference minus current.
"""

from __future__ import annotations

import numpy as np

from ._conditional import mean_rank_p_value
from ._stat import StatResult, TestOptions
from .errors import WindowTooSmall

__all__ = ["relevance_drop_test"]

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
    return StatResult("relevance_drop", RELEVANCE_DROP_METHOD, w, float(x.mean() - y.mean()), p, x.size, y.size, 0)
