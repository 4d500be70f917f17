"""The results of a drift evaluation: frozen dataclasses and their one JSON shape.

`DriftReport.to_json()` is the shape the HTTP API (`GET /api/v1/drift/{id}`), the web page,
`infersight drift --json` and the stored reports share; docs/architecture.md documents it.
Every key is always present (null or an empty list where there is nothing to say).

Stored, a report keeps its headline in columns and the full JSON in `content`;
`DriftMetrics` sets the module's Prometheus gauges in a registry the caller owns.

The HTML page of a report is _report_html.py's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from sqlalchemy import Connection, Engine, insert, select

from ..store.tables import drift_reports
from ._explain import FieldExplanation
from ._lengths import LengthDrift
from ._references import _tx
from ._stat_tests import RELEVANCE_BUCKETS, RelevanceComparison

__all__ = [
    "REPORT_SCHEMA",
    "DriftMetrics",
    "DriftReport",
    "FieldVerdict",
    "ReportContext",
    "TestResult",
    "list_reports",
    "load_report",
    "save_report",
]


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
    # The smallest share of this window's texts, farther from the reference than its own
    # texts, that the verdict detects with 90% power (None without a novelty test).
    detectable_share: float | None = None


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
    correction: str  # e.g. "holm(5)", or "holm(2; mmd 1, novelty 3)" with unequal shares of alpha
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

    @property
    def detectable_share(self) -> float | None:
        """The prompts' smallest detectable share of new-topic texts (90% power)."""
        prompt = self.field("prompt")
        return None if prompt is None else prompt.detectable_share

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
            "detectable_share": self.detectable_share,
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


def save_report(
    bind: Engine | Connection,
    report: DriftReport,
    *,
    reference_id: int | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> int:
    """Store `report`; returns its id (the `{report_id}` of `GET /api/v1/drift/{report_id}`)."""
    c = report.context
    with _tx(bind) as conn:
        result = conn.execute(
            insert(drift_reports).values(
                created_at=dt.datetime.fromisoformat(c.created_at),
                model=c.model,
                model_version=c.model_version,
                reference_id=reference_id,
                since=since,
                until=until,
                drifted=report.drifted,
                p_value=report.p_value,
                score=report.score,
                method=report.method,
                n_reference=report.n_reference,
                n_current=report.n_current,
                content=report.dumps(),
            )
        )
        return int(result.inserted_primary_key[0])  # type: ignore[index]


def load_report(bind: Engine | Connection, report_id: int) -> dict[str, Any] | None:
    """The stored `DriftReport.to_json()` with its `id`, or None."""
    with _tx(bind) as conn:
        row = conn.execute(
            select(drift_reports.c.id, drift_reports.c.content).where(drift_reports.c.id == report_id)
        ).first()
    if row is None:
        return None
    out: dict[str, Any] = {"id": row.id, **json.loads(row.content)}
    return out


def list_reports(
    bind: Engine | Connection, *, model_version: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Summaries (`DriftReport.summary_json()` plus `id`), newest first."""
    query = select(drift_reports.c.id, drift_reports.c.content).order_by(
        drift_reports.c.created_at.desc(), drift_reports.c.id.desc()
    )
    if model_version is not None:
        query = query.where(drift_reports.c.model_version == model_version)
    with _tx(bind) as conn:
        rows = list(conn.execute(query.limit(limit)))
    keep = (
        "schema",
        "drift",
        "p_value",
        "score",
        "threshold",
        "alpha",
        "method",
        "correction",
        "n_reference",
        "n_current",
        "created_at",
        "model",
        "model_version",
        "reference",
        "window",
        "fields",
        "length_drift",
        "detectable_share",
    )
    out = []
    for row in rows:
        content = json.loads(row.content)
        out.append({"id": row.id, **{k: content.get(k) for k in keep}})
    return out


class DriftMetrics:
    """The gauges of docs/architecture.md, set from a report, and the relevance histogram.

    Per field (prompt, response): `infersight_drift_p_value` (smallest Holm-adjusted p of
    the field's tests), `infersight_drift_score` (the field's MMD²), `infersight_drift_detected`
    (0/1), `infersight_drift_novelty_rate`. Per model version: `infersight_relevance_mean`
    (the current window's mean prompt-response cosine) and `infersight_relevance_score`
    (one observation per request). Per length field (prompt, output):
    `infersight_length_drift_p_value`.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("model", "model_version", "field")
        self.p_value = Gauge(
            "infersight_drift_p_value",
            "Latest batch drift test p-value (Holm-adjusted)",
            labels,
            registry=registry,
        )
        self.score = Gauge(
            "infersight_drift_score", "Latest batch drift effect size (MMD²)", labels, registry=registry
        )
        self.detected = Gauge(
            "infersight_drift_detected",
            "1 when the latest batch test declared drift",
            labels,
            registry=registry,
        )
        self.novelty_rate = Gauge(
            "infersight_drift_novelty_rate",
            "Share of current texts beyond the reference's own 1% tail",
            labels,
            registry=registry,
        )
        self.length_p_value = Gauge(
            "infersight_length_drift_p_value",
            "Latest request-length drift test p-value (Holm-adjusted within the length section)",
            ("model", "model_version", "field"),
            registry=registry,
        )
        self.relevance_mean = Gauge(
            "infersight_relevance_mean",
            "Windowed mean prompt-response cosine",
            ("model", "model_version"),
            registry=registry,
        )
        self.relevance = Histogram(
            "infersight_relevance_score",
            "Prompt-response cosine per request",
            ("model", "model_version"),
            buckets=RELEVANCE_BUCKETS[1:],
            registry=registry,
        )

    def observe_report(
        self, report: DriftReport, *, model: str | None = None, model_version: str | None = None
    ) -> None:
        m = model or report.context.model or ""
        v = model_version or report.context.model_version or ""
        for f in report.fields:
            self.p_value.labels(m, v, f.field).set(f.p_value)
            self.score.labels(m, v, f.field).set(f.score)
            self.detected.labels(m, v, f.field).set(1.0 if f.drifted else 0.0)
            if f.novelty_rate is not None:
                self.novelty_rate.labels(m, v, f.field).set(f.novelty_rate)
        if report.relevance is not None and report.relevance.current.mean is not None:
            self.relevance_mean.labels(m, v).set(report.relevance.current.mean)
        if report.lengths is not None:
            for name in ("prompt", "output"):
                p = report.lengths.field_p_value(name)
                if p is not None:
                    self.length_p_value.labels(m, v, name).set(p)

    def forget(self, *, model: str, model_version: str) -> None:
        """Remove every series of a version nobody serves any more (its alerts then resolve)."""
        for gauge in (self.p_value, self.score, self.detected, self.novelty_rate, self.length_p_value):
            for name in ("prompt", "response", "output"):
                with contextlib.suppress(KeyError):
                    gauge.remove(model, model_version, name)
        with contextlib.suppress(KeyError):
            self.relevance_mean.remove(model, model_version)

    def observe_relevance(self, values: Iterable[float], *, model: str, model_version: str) -> None:
        child = self.relevance.labels(model, model_version)
        for value in values:
            child.observe(float(value))
