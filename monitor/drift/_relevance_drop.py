"""Relevance-drop test: are current prompt-response cosines lower than the reference's?

One-sided Mann-Whitney U (reference stochastically greater than current); effect size
(`score`) is the drop of the mean cosine, reference minus current.
"""

from __future__ import annotations

import numpy as np

from ._stat import StatResult
from .errors import WindowTooSmall

__all__ = ["relevance_drop_test"]

METHOD = "mann_whitney_u_one_sided"


def relevance_drop_test(reference: np.ndarray, current: np.ndarray) -> StatResult:
    """`reference` and `current` are 1-D arrays of per-request relevance."""
    from scipy.stats import mannwhitneyu  # slow to import: only when testing

    x = np.asarray(reference, dtype=np.float64).ravel()
    y = np.asarray(current, dtype=np.float64).ravel()
    if x.size < 2:
        raise WindowTooSmall("reference relevance", int(x.size), 2)
    if y.size < 2:
        raise WindowTooSmall("current relevance", int(y.size), 2)
    u, p = mannwhitneyu(x, y, alternative="greater", method="auto")
    return StatResult(
        "relevance_drop", METHOD, float(u), float(x.mean() - y.mean()), float(p), x.size, y.size, 0
    )
