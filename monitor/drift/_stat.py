"""The contract of a statistical test: a pure function `(reference, current, options) -> StatResult`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ._kernel import BANDWIDTH_MULTIPLIERS

__all__ = ["StatResult", "StatTest", "TestOptions"]


@dataclass(frozen=True)
class TestOptions:
    """Knobs shared by the tests; every default is what `infersight drift` uses."""

    __test__ = False  # not a pytest class

    permutations: int = 1000
    seed: int = 0
    bandwidth_multipliers: tuple[float, ...] = BANDWIDTH_MULTIPLIERS
    # Exact MMD (an [n, n] kernel) while reference + current <= exact_max_pool, else
    # random Fourier features with `rff_frequencies` frequencies per bandwidth.
    exact_max_pool: int = 4000
    rff_frequencies: int = 128
    permutation_chunk: int = 128  # permutations per matrix product (bounds memory)
    # Nearest-neighbour novelty: share of the reference held out for calibration, and the
    # upper tail of the held-out scores beyond which current texts are counted.
    calibration_fraction: float = 0.5
    novelty_tail: float = 0.01
    # Tests that bound the reference's own sampling error first (novelty, relevance, the
    # streaming charts) hold their level for at least this share of references (_conditional).
    reference_confidence: float = 0.99

    def __post_init__(self) -> None:
        if self.permutations < 1:
            raise ValueError("permutations must be at least 1")
        if not 0.0 < self.calibration_fraction < 1.0:
            raise ValueError("calibration_fraction must be in (0, 1)")
        if not 0.0 < self.novelty_tail < 0.5:
            raise ValueError("novelty_tail must be in (0, 0.5)")
        if not 0.5 <= self.reference_confidence < 1.0:
            raise ValueError("reference_confidence must be in [0.5, 1)")
        if self.exact_max_pool < 0 or self.rff_frequencies < 1 or self.permutation_chunk < 1:
            raise ValueError("exact_max_pool, rff_frequencies and permutation_chunk must be positive")
        if not self.bandwidth_multipliers or min(self.bandwidth_multipliers) <= 0:
            raise ValueError("bandwidth_multipliers must be positive")


@dataclass(frozen=True)
class StatResult:
    """What one test measured on one field.

    `statistic` is the test's raw statistic (MMD², a count, U); `score` its effect size in
    the unit the test documents (compared with an effect floor); `p_value` is unadjusted.
    """

    test: str
    method: str
    statistic: float
    score: float
    p_value: float
    n_reference: int
    n_current: int
    permutations: int  # 0 when the p-value is exact in closed form


class StatTest(Protocol):
    def __call__(self, reference: np.ndarray, current: np.ndarray, options: TestOptions) -> StatResult: ...
