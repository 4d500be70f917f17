"""What the service's scheduler calls: which reference each model version is tested
against (`ReferencePolicy`: the configured file, or the version's own first requests), and
`evaluate_window`: a window of recorded traffic against a stored reference, the report
stored, per-request relevance filled in, the gauges set."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from infersight.monitor.store.tables import requests
from sqlalchemy import Engine, bindparam, func, select, update

from ._detector import DriftDetector, FittedReference
from ._lengths import LengthDrift, RequestLengths, length_drift, read_lengths
from ._references import (
    StoredReference,
    _window,
    first_requests_after,
    load_reference,
    save_reference,
    traffic_lengths,
)
from ._report import DriftMetrics, DriftReport, ReportContext, save_report
from ._windows import TextWindow, read_window
from .errors import CurrentWindowEmpty, ReferenceNotFound

__all__ = ["CONFIGURED_REFERENCE", "ReferencePolicy", "evaluate_window", "fit_stored"]

CONFIGURED_REFERENCE = "configured"  # the name the configured reference file is stored under


def fit_stored(detector: DriftDetector, stored: StoredReference) -> FittedReference:
    """The fitted reference for a stored one: its stored embeddings when the detector's
    embedder made them, else its texts embedded now; kept in the detector's cache."""
    key = ("stored", stored.info.id, detector.embedder_name)
    source = (
        stored.embedded
        if stored.embedded is not None and stored.info.embedder == detector.embedder_name
        else stored.window
    )
    return detector.fit(source, name=stored.info.name, version=stored.info.version, cache_key=key)


def evaluate_window(
    bind: Engine,
    *,
    detector: DriftDetector,
    model_version: str,
    reference: str | StoredReference | None,
    since: dt.datetime,
    until: dt.datetime,
    model: str | None = None,
    metrics: DriftMetrics | None = None,
    store: bool = True,
    max_current: int = 5000,
) -> DriftReport:
    """Requests of `model_version` that started in `[since, until)` (the newest
    `max_current` with a sampled prompt) against `reference`: a stored reference, its name
    (newest version), or None for the newest reference of `model_version`.

    Raises `ReferenceNotFound`, `CurrentWindowEmpty` or `WindowTooSmall` (all `DriftError`).
    """
    stored = (
        reference
        if isinstance(reference, StoredReference)
        else load_reference(bind, reference, embedder=detector.embedder_name)
        if reference is not None
        else load_reference(bind, model_version=model_version, embedder=detector.embedder_name)
    )
    fitted = fit_stored(detector, stored)
    rows = _traffic(bind, model_version, since, until, max_current, model)
    window = _window(rows, f"requests of {model_version} {since.isoformat()} .. {until.isoformat()}")
    if not window.prompts:
        raise CurrentWindowEmpty(window.source)
    current = detector.embed(window)[0]
    context = ReportContext(
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        model=model,
        model_version=model_version,
        reference_name=stored.info.name,
        reference_version=stored.info.version,
        since=since.isoformat(),
        until=until.isoformat(),
        embedder=detector.embedder_name,
        seed=detector.config.options.seed,
    )
    report = detector.compare(fitted, current, context=context)
    report = replace(
        report, lengths=_lengths(bind, detector, stored, window, rows, model_version, until, model)
    )
    fresh = _store_relevance(bind, rows, window, current.relevance)
    if metrics is not None:
        metrics.observe_report(report, model=model or "", model_version=model_version)
        if fresh.size:
            metrics.observe_relevance(fresh, model=model or "", model_version=model_version)
    if store:
        save_report(bind, report, reference_id=stored.info.id, since=since, until=until)
    return report


def _lengths(
    bind: Engine,
    detector: DriftDetector,
    stored: StoredReference,
    window: TextWindow,
    rows: list[Any],
    model_version: str,
    until: dt.datetime,
    model: str | None,
) -> LengthDrift:
    """The length section: every request's recorded token counts over the text window's span
    against the reference's stored counts; the texts' word counts when the reference has none."""
    cfg = detector.config
    if stored.lengths is not None:
        reference = stored.lengths
        current = traffic_lengths(bind, model_version=model_version, since=rows[0].started_at, until=until,
                                  model=model)  # fmt: skip
    else:
        reference = RequestLengths.of_texts(stored.window.prompts, stored.window.responses)
        current = RequestLengths.of_texts(window.prompts, window.responses)
    return length_drift(
        reference, current, alpha=cfg.alpha, min_reference=cfg.min_reference, min_current=cfg.min_current
    )


def _traffic(
    bind: Engine, model_version: str, since: dt.datetime, until: dt.datetime, limit: int, model: str | None
) -> list[Any]:
    r = requests.c
    query = (
        select(r.id, r.prompt, r.response, r.relevance, r.started_at)
        .where(
            r.prompt.is_not(None),
            r.model_version == model_version,
            r.started_at >= since,
            r.started_at < until,
        )
        .order_by(r.started_at.desc(), r.id.desc())
        .limit(limit)
    )
    if model is not None:
        query = query.where(r.model == model)
    with bind.connect() as conn:
        rows = list(conn.execute(query))
    rows.sort(key=lambda row: (row.started_at, row.id))
    return [row for row in rows if row.prompt and row.prompt.strip()]


def _store_relevance(bind: Engine, rows: list[Any], window: TextWindow, relevance: np.ndarray) -> np.ndarray:
    """Write the relevance of requests that have a response and none stored yet; returns those values."""
    with_response = [
        row
        for row, resp in zip(rows, window.responses or (None,) * len(rows), strict=True)
        if resp is not None
    ]
    todo = [
        (row.id, float(value))
        for row, value in zip(with_response, relevance, strict=True)
        if row.relevance is None
    ]
    if todo:
        with bind.begin() as conn:
            conn.execute(
                update(requests).where(requests.c.id == bindparam("rid")).values(relevance=bindparam("rel")),
                [{"rid": rid, "rel": rel} for rid, rel in todo],
            )
    return np.asarray([rel for _, rel in todo], dtype=np.float64)


class ReferencePolicy:
    """Which stored reference each model version is tested against (drift policy).

    With a configured file (the service's `drift.reference`), every version is tested
    against it: stored at start as reference "configured", as a new version of it only when
    its texts changed. Without one, each model version gets its own reference from its
    first `window` sampled requests (source "deploy", name "<version>-baseline"), stored
    once that many exist, with every request's token lengths over the same span."""

    def __init__(
        self, engine: Engine, detector: DriftDetector, *, window: int, configured_path: str | Path | None = None
    ) -> None:
        self.engine = engine
        self.detector = detector
        self.window = window
        self.configured_path = configured_path
        self.configured: str | None = None  # the name of the configured reference, once stored

    def store_configured(self) -> None:
        """Store the configured file as reference "configured" (unchanged texts: kept as is)."""
        if self.configured_path is None:
            return
        path = self.configured_path
        window = read_window(path, "reference")
        try:
            current = load_reference(self.engine, CONFIGURED_REFERENCE)
            if current.window.prompts == window.prompts and current.window.responses == window.responses:
                self.configured = CONFIGURED_REFERENCE
                return
        except ReferenceNotFound:
            pass
        (embedded,) = self.detector.embed(window)
        lengths = read_lengths(path, window.prompts, window.responses)
        save_reference(self.engine, CONFIGURED_REFERENCE, window, model_version="*", source="file",
                       source_detail=str(path), embedded=embedded, embedder=self.detector.embedder_name,
                       lengths=lengths)  # fmt: skip
        self.configured = CONFIGURED_REFERENCE

    def stored_for(self, model_version: str) -> StoredReference | None:
        """The reference `model_version` is tested against, if it is stored yet."""
        try:
            if self.configured is not None:
                return load_reference(self.engine, self.configured, embedder=self.detector.embedder_name)
            return load_reference(self.engine, model_version=model_version, embedder=self.detector.embedder_name)
        except ReferenceNotFound:
            return None

    def reference_for(self, model_version: str) -> StoredReference | None:
        """`stored_for`, storing the version's deploy baseline first when its first `window`
        requests are in; None while they are still being collected."""
        if self.configured is not None:
            return load_reference(self.engine, self.configured, embedder=self.detector.embedder_name)
        try:
            return load_reference(self.engine, model_version=model_version, embedder=self.detector.embedder_name)
        except ReferenceNotFound:
            pass
        first = self._first_seen(model_version)
        if first is None:
            return None
        window = first_requests_after(self.engine, model_version=model_version, after=first, n=self.window)
        if len(window.prompts) < self.window:
            return None  # still collecting the reference
        (embedded,) = self.detector.embed(window)
        # every request's lengths (sampled text or not) over the same span
        lengths = traffic_lengths(
            self.engine, model_version=model_version, since=first, until=dt.datetime.now(dt.UTC)
        )
        save_reference(self.engine, f"{model_version}-baseline", window, model_version=model_version,
                       source="deploy", source_detail=f"first {len(window.prompts)} requests after {first.isoformat()}",
                       embedded=embedded, embedder=self.detector.embedder_name, lengths=lengths)  # fmt: skip
        return load_reference(self.engine, model_version=model_version, embedder=self.detector.embedder_name)

    def _first_seen(self, model_version: str) -> dt.datetime | None:
        with self.engine.connect() as conn:
            value = conn.execute(
                select(func.min(requests.c.started_at)).where(
                    requests.c.model_version == model_version, requests.c.prompt.is_not(None)
                )
            ).scalar()
        return value if isinstance(value, dt.datetime) else None
