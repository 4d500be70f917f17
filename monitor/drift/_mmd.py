"""The MMD test as the detector runs it: exact kernel up to a pooled size, random features above."""

from __future__ import annotations

import numpy as np

from ._mmd_exact import mmd_exact_test
from ._mmd_rff import mmd_rff_test
from ._stat import StatResult, TestOptions

__all__ = ["mmd_test"]


def mmd_test(reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult:
    """`mmd_exact_test` while `len(reference) + len(current) <= options.exact_max_pool`,
    else `mmd_rff_test`; the result's `method` says which ran."""
    if reference.shape[0] + current.shape[0] <= options.exact_max_pool:
        return mmd_exact_test(reference, current, options)
    return mmd_rff_test(reference, current, options)
