"""Actions that keep evidence.

Inference snapshots: the last N requests (prompts, responses, timings) from the shared
`requests` table, the current metrics text, the latest drift report, and the serving
version with its config, kept in the store's `snapshots` table and written as JSON and as
a self-contained HTML page a person can open.

A snapshot about a version keeps only that version's requests (other versions' traffic is
not evidence about it, and its text is not for this page). The files hold prompt and answer
text: they are created with mode 0600, readable by the service's own user only. The
store's retention deletes them with their row.

The `collect` action: after a rollback or a drift alert, keep the next N requests of the
drifted kind for export (`infersight dataset export --kind collected`).

It opens a row of the store's `dataset_collections`; the service's collection job
(monitor/dataset) then copies matching requests into `dataset_items` as they arrive, so
what was kept outlives the `requests` table's retention. Kinds:
- `version` (default): requests of the alerted version (its `model_version` label, else the
  serving one). Right for a drift alert on a version that keeps serving.
- `any`: every request, whatever serves it. Right after a rollback: the same traffic, now
  answered by the previous version, becomes a validation set for the next release.
- `failed`: requests that ended in an error, of any version.

Idempotent like the other actions: the runner runs an alert episode's action once, and the
collection's id is its run's, so a retried run never opens a second collection.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from infersight.monitor.store.tables import by_start, dataset_collections, requests, snapshots
from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError

from ..rules.rules import COLLECT_KINDS

__all__ = [
    "CollectionOpened",
    "SnapshotResult",
    "SnapshotSource",
    "open_collection",
    "render_html",
    "take_snapshot",
]


@runtime_checkable
class SnapshotSource(Protocol):
    """What the service knows beyond the `requests` table. Each may return empty/None."""

    def metrics_text(self) -> str: ...

    def latest_drift_report(self) -> Mapping[str, Any] | None: ...

    def version_config(self, version: str | None) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True)
class SnapshotResult:
    snapshot_id: str
    row_id: int
    html_path: Path
    json_path: Path
    request_count: int
    model_version: str | None


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def recent_requests(engine: Engine, n: int, *, model_version: str | None = None) -> list[dict[str, Any]]:
    """The last `n` requests (newest first), of `model_version` only when one is given."""
    q = select(requests).order_by(*by_start(newest_first=True)).limit(n)
    if model_version is not None:
        q = q.where(requests.c.model_version == model_version)
    with engine.connect() as conn:
        rows = conn.execute(q).mappings().all()
    return [
        {k: (_iso(v) if isinstance(v, dt.datetime) else v) for k, v in r.items() if k != "id"} for r in rows
    ]


def render_html(content: Mapping[str, Any]) -> str:
    """A page with no scripts and no remote resources; every value escaped."""
    e = html.escape
    rows = "".join(
        "<tr>"
        + "".join(f"<td>{e(str(r.get(k, '')) if r.get(k) is not None else '')}</td>" for k in _COLS)
        + "</tr>"
        for r in content["requests"]
    )
    head = "".join(f"<th>{e(k)}</th>" for k in _COLS)
    meta = json.dumps(
        {k: content[k] for k in ("snapshot_id", "taken_at", "trigger", "reason", "model_version")}, indent=2
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infersight snapshot {e(content["snapshot_id"])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:4px;vertical-align:top;max-width:40em;overflow-wrap:anywhere}}
pre{{background:#f6f6f6;padding:1em;overflow:auto;max-height:30em}}</style></head><body>
<h1>Inference snapshot</h1><pre>{e(meta)}</pre>
{_diagnosis_html(content.get("diagnosis"))}<h2>Last {len(content["requests"])} requests</h2><table><tr>{head}</tr>{rows}</table>
<h2>Model version config</h2><pre>{e(json.dumps(content["version_config"], indent=2))}</pre>
<h2>Latest drift report</h2><pre>{e(json.dumps(content["drift_report"], indent=2))}</pre>
<h2>Metrics</h2><pre>{e(content["metrics"])}</pre>
</body></html>
"""


def _diagnosis_html(diagnosis: Mapping[str, Any] | None) -> str:
    if not diagnosis:
        return ""
    e = html.escape
    rows = "".join(
        f"<tr><td>{i}</td><td>{e(str(c.get('name')))}</td><td>{e(str(c.get('verdict')))}</td>"
        f"<td>{e(str(c.get('figure')))}</td></tr>"
        for i, c in enumerate(diagnosis.get("checks", []), 1)
    )
    return (f"<h2>Diagnosis</h2><p>{e(str(diagnosis.get('summary', '')))}</p>"
            f"<table><tr><th>rank</th><th>check</th><th>verdict</th><th>figure</th></tr>{rows}</table>")  # fmt: skip


_COLS = (
    "started_at",
    "model_version",
    "request_id",
    "duration_s",
    "ttft_s",
    "tpot_s",
    "queue_s",
    "prompt_tokens",
    "output_tokens",
    "error_type",
    "relevance",
    "prompt",
    "response",
)


def _write(path: Path, text: str) -> None:
    """Atomically, with mode 0600 from creation on (never briefly readable by others)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode only applies to a new file
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = -1
            f.write(text)
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(tmp, path)


def take_snapshot(
    engine: Engine,
    *,
    data_dir: Path,
    requests_n: int,
    trigger: str,
    reason: str,
    now: dt.datetime,
    model_version: str | None,
    source: SnapshotSource | None = None,
    diagnosis: Mapping[str, Any] | None = None,
) -> SnapshotResult:
    # this form is what retention recognises as a snapshot's file (monitor/store/retention.py)
    snapshot_id = f"{now.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"
    reqs = recent_requests(engine, requests_n, model_version=model_version)
    content: dict[str, Any] = {
        "snapshot_id": snapshot_id,
        "taken_at": now.isoformat(),
        "trigger": trigger,
        "reason": reason,
        "model_version": model_version,
        "version_config": dict(source.version_config(model_version) or {}) if source else None,
        "requests": reqs,
        "metrics": source.metrics_text() if source else "",
        "drift_report": dict(source.latest_drift_report() or {}) if source else None,
        "diagnosis": dict(diagnosis) if diagnosis else None,  # the alert's checklist, when it ran
    }
    folder = Path(data_dir) / "snapshots"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    json_path, html_path = folder / f"{snapshot_id}.json", folder / f"{snapshot_id}.html"
    text = json.dumps(content, indent=2, default=str)
    _write(json_path, text)
    _write(html_path, render_html(content))
    with engine.begin() as conn:
        result = conn.execute(
            insert(snapshots).values(
                snapshot_id=snapshot_id,
                taken_at=now,
                trigger=trigger,
                reason=reason,
                model_version=model_version,
                request_count=len(reqs),
                path=str(html_path),
                content=text,
            )
        )
        pk = result.inserted_primary_key
    assert pk is not None
    return SnapshotResult(snapshot_id, int(pk[0]), html_path, json_path, len(reqs), model_version)


@dataclass(frozen=True)
class CollectionOpened:
    collection_id: str
    kind: str
    model_version: str | None
    n: int
    created: bool  # False: this run had opened it already


def open_collection(
    engine: Engine,
    *,
    collection_id: str,
    kind: str,
    n: int,
    model_version: str | None,
    reason: str,
    now: dt.datetime,
) -> CollectionOpened:
    if kind not in COLLECT_KINDS or n < 1:
        raise ValueError(f"collect: kind must be one of {', '.join(COLLECT_KINDS)} and n positive")
    version = model_version if kind == "version" else None
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(dataset_collections).values(
                    collection_id=collection_id,
                    created_at=now,
                    kind=kind,
                    model_version=version,
                    n=n,
                    collected=0,
                    reason=reason,
                )
            )
    except IntegrityError:
        with engine.connect() as conn:
            row = conn.execute(
                select(dataset_collections).where(dataset_collections.c.collection_id == collection_id)
            ).one()
        return CollectionOpened(row.collection_id, row.kind, row.model_version, row.n, created=False)
    return CollectionOpened(collection_id, kind, version, n, created=True)
