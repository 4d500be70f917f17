"""Drift reports in the store: the headline in columns, the full JSON in `content`."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy import Connection, Engine, insert, select

from ..store.tables import drift_reports
from ._references import _tx
from ._results import DriftReport

__all__ = ["list_reports", "load_report", "save_report"]


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
    )
    out = []
    for row in rows:
        content = json.loads(row.content)
        out.append({"id": row.id, **{k: content.get(k) for k in keep}})
    return out
