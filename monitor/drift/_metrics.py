"""Prometheus metrics of the drift module, in a registry the caller owns."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Gauge, Histogram

from ._relevance import RELEVANCE_BUCKETS
from ._results import DriftReport

__all__ = ["DriftMetrics"]


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
