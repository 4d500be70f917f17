"""Holm's step-down adjustment: family-wise error at alpha under any dependence."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["holm_adjust"]


def holm_adjust(p_values: Sequence[float]) -> tuple[float, ...]:
    """Adjusted p-values in the input order: reject test i at level alpha iff adjusted[i] < alpha.

    The smallest adjusted value is `m · min p` (Bonferroni's), so "any test rejects"
    has false-alarm probability at most alpha when every null holds."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    if m == 0:
        return ()
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return tuple(float(v) for v in adjusted)
