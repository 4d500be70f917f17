"""How a detector decides: level, tests, effect floors, explanation sizes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ._registry import STAT_TESTS
from ._stat import TestOptions
from .errors import UnknownTest

__all__ = ["DEFAULT_EFFECT_FLOORS", "DriftConfig"]

# Effect sizes below these are "trivial" and never declared drift, however small the p.
# MMD² in kernel units: on MiniLM / Banking77 a 10% admixture of a new topic gives about
# 7e-4 and MMD² grows with the square of the admixture, so 1e-4 is roughly a 4% admixture.
# Novelty: excess share of current texts in the pooled tail (2 percentage points).
# Relevance: drop of the mean prompt-response cosine (0.05).
DEFAULT_EFFECT_FLOORS: Mapping[str, float] = MappingProxyType(
    {"mmd": 1e-4, "mmd_exact": 1e-4, "mmd_rff": 1e-4, "novelty": 0.02, "relevance_drop": 0.05}
)


@dataclass(frozen=True)
class DriftConfig:
    alpha: float = 0.05  # family-wise: Holm across every test and field of a report
    tests: tuple[str, ...] = ("mmd", "novelty")  # run on prompts and on responses
    relevance_test: bool = True  # one-sided relevance drop when both windows have responses
    effect_floors: Mapping[str, float] = field(default_factory=lambda: DEFAULT_EFFECT_FLOORS)
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
        if self.min_reference < 4 or self.min_current < 2:
            raise ValueError("min_reference must be at least 4 and min_current at least 2")

    def floor(self, test: str) -> float:
        return float(self.effect_floors.get(test, 0.0))
