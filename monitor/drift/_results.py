"""The results of a drift evaluation: frozen dataclasses and their one JSON shape.

`DriftReport.to_json()` is the shape the HTTP API (`GET /api/v1/drift/{id}`), the web page,
`infersight drift --json` and the stored reports share; docs/architecture.md documents it.
Every key is always present (null or an empty list where there is nothing to say).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ._explanation import FieldExplanation
from ._lengths import LengthDrift
from ._relevance import RelevanceComparison

__all__ = ["REPORT_SCHEMA", "DriftReport", "FieldVerdict", "ReportContext", "TestResult"]

REPORT_SCHEMA = "infersight.drift.report/1"


@dataclass(frozen=True)
class TestResult:
    """One test on one field, after the multiple-testing correction.

    `drifted` is `p_adjusted < threshold and score >= effect_floor`.
    """

    __test__ = False  # not a pytest class

    field: str  # prompt, response, relevance
    test: str  # registry name: mmd, novelty, relevance_drop, ...
    method: str  # what ran, e.g. mmd2_permutation_exact or mmd2_permutation_rff(features=1280)
    statistic: float
    score: float  # effect size (unit per test: MMD², excess novel share, drop of mean cosine)
    effect_floor: float
    p_value: float  # unadjusted
    p_adjusted: float  # Holm across every test of the report
    threshold: float  # alpha
    drifted: bool
    n_reference: int
    n_current: int
    permutations: int


@dataclass(frozen=True)
class FieldVerdict:
    field: str
    drifted: bool
    p_value: float  # smallest adjusted p-value among the field's tests
    score: float  # the field's MMD² (its drift score gauge)
    novelty_rate: float | None


@dataclass(frozen=True)
class ReportContext:
    created_at: str  # ISO 8601, UTC
    model: str | None = None
    model_version: str | None = None
    reference_name: str | None = None
    reference_version: int | None = None
    since: str | None = None
    until: str | None = None
    embedder: str | None = None
    seed: int = 0


@dataclass(frozen=True)
class DriftReport:
    drifted: bool
    p_value: float  # smallest Holm-adjusted p-value over all tests
    score: (
        float  # effect size of the deciding test (the drifted one with the smallest p, else the smallest p)
    )
    threshold: float  # alpha
    method: str  # the deciding test's method
    correction: str  # e.g. "holm(5)"
    n_reference: int
    n_current: int
    tests: tuple[TestResult, ...]
    fields: tuple[FieldVerdict, ...]
    relevance: RelevanceComparison | None
    explanations: tuple[FieldExplanation, ...]
    context: ReportContext
    lengths: LengthDrift | None = None  # request lengths: a section with its own verdict
    notes: tuple[str, ...] = ()  # what a reader should know about the windows (e.g. repeated texts)

    def field(self, name: str) -> FieldVerdict | None:
        return next((f for f in self.fields if f.field == name), None)

    def explanation(self, name: str) -> FieldExplanation | None:
        return next((e for e in self.explanations if e.field == name), None)

    def summary_json(self) -> dict[str, Any]:
        """The headline, without tests and explanations (for lists of reports)."""
        c = self.context
        return {
            "schema": REPORT_SCHEMA,
            "drift": self.drifted,
            "p_value": self.p_value,
            "score": self.score,
            "threshold": self.threshold,
            "alpha": self.threshold,
            "method": self.method,
            "correction": self.correction,
            "n_reference": self.n_reference,
            "n_current": self.n_current,
            "created_at": c.created_at,
            "model": c.model,
            "model_version": c.model_version,
            "reference": None
            if c.reference_name is None
            else {"name": c.reference_name, "version": c.reference_version},
            "window": {"since": c.since, "until": c.until},
            "fields": [asdict(f) for f in self.fields],
            "length_drift": None if self.lengths is None else self.lengths.drifted,
            "notes": list(self.notes),
        }

    def to_json(self) -> dict[str, Any]:
        out = self.summary_json()
        out["embedder"] = self.context.embedder
        out["seed"] = self.context.seed
        out["tests"] = [asdict(t) for t in self.tests]
        out["relevance"] = None if self.relevance is None else asdict(self.relevance)
        by_field = {e.field: asdict(e) for e in self.explanations}
        out["explanation"] = {"prompt": by_field.get("prompt"), "response": by_field.get("response")}
        out["lengths"] = None if self.lengths is None else self.lengths.to_json()
        return out

    def dumps(self, **kwargs: Any) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, allow_nan=False, **kwargs)
