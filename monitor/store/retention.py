"""Retention: old rows are deleted on a schedule; evidence people still need is kept.

Each rule names a table, its time column and, where only some rows may go, a condition
(a delivered notification may go; a dead letter stays until a person deals with it).
Deletes run in bounded batches, each its own transaction, so a large backlog never holds
SQLite's write lock for long. A rule whose table is not in the schema is reported in
`RetentionResult.skipped` (tests assert there are none).

Snapshots are also files (`<data_dir>/snapshots/<snapshot_id>.html|.json`, written by the
replica that took them). `prune_snapshot_files` deletes, in one replica's folder, the files
whose row is gone (expired, or never written) once they are older than a grace period;
`enforce_retention(..., snapshot_dir=...)` runs it after deleting the rows.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, Table, delete, select

__all__ = ["RetentionPolicy", "RetentionResult", "enforce_retention", "prune_snapshot_files"]

_SNAPSHOT_SUFFIXES = (".html", ".json", ".tmp")
# the snapshot ids take_snapshot makes (alerts/actions/evidence.py): other files are never touched
_SNAPSHOT_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}")
_FILE_GRACE_S = 3600.0  # a file this young may belong to a snapshot whose row is being written


@dataclass(frozen=True)
class RetentionPolicy:
    """How long rows are kept, in days; None keeps them forever."""

    # recorded requests
    requests_days: float | None = 14
    # drift reports
    drift_reports_days: float | None = 90
    # alert state changes
    alert_history_days: float | None = 90
    notifications_days: float | None = 30  # delivered outbox rows and the notification log
    # rollback snapshots and their files
    snapshots_days: float | None = 90

    def __post_init__(self) -> None:
        for name in (
            "requests_days",
            "drift_reports_days",
            "alert_history_days",
            "notifications_days",
            "snapshots_days",
        ):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"retention.{name}: must be a positive number of days or null")


@dataclass(frozen=True)
class RetentionResult:
    deleted: Mapping[str, int]
    skipped: tuple[str, ...] = field(default=())
    files_deleted: int = 0  # snapshot files removed with (or after) their rows


@dataclass(frozen=True)
class _Rule:
    policy_field: str
    table: str
    time_column: str
    only_when: tuple[str, tuple[str, ...]] | None = None  # (column, values)
    bucket_column: str | None = None  # the indexed coarse time (`tables.time_bucket`) beside `time_column`


_RULES = (
    _Rule("requests_days", "requests", "started_at", bucket_column="started_bucket"),
    _Rule("snapshots_days", "snapshots", "taken_at"),
    _Rule("drift_reports_days", "drift_reports", "created_at"),
    _Rule("alert_history_days", "alert_history", "at"),
    _Rule("notifications_days", "alert_outbox", "created_at", ("state", ("delivered",))),
    _Rule("notifications_days", "alert_notification_log", "at"),
)


def enforce_retention(
    engine: Engine,
    policy: RetentionPolicy,
    *,
    now: dt.datetime | None = None,
    batch_size: int = 5000,
    snapshot_dir: Path | None = None,
) -> RetentionResult:
    """Delete what `policy` lets go; with `snapshot_dir`, also the snapshot files there
    whose rows are gone (`prune_snapshot_files`)."""
    from .tables import metadata  # every area's tables (imported late: they import this package)

    now = now or dt.datetime.now(dt.UTC)
    deleted: dict[str, int] = {}
    skipped: list[str] = []
    for rule in _RULES:
        days = getattr(policy, rule.policy_field)
        table = metadata.tables.get(rule.table)
        if (
            table is None
            or rule.time_column not in table.c
            or (rule.only_when is not None and rule.only_when[0] not in table.c)
        ):
            skipped.append(rule.table)
            continue
        if days is None:
            continue
        cutoff = now - dt.timedelta(days=days)
        deleted[rule.table] = deleted.get(rule.table, 0) + _delete_older(
            engine, table, rule, cutoff, batch_size
        )
    files = 0 if snapshot_dir is None else prune_snapshot_files(engine, snapshot_dir, now=now)
    return RetentionResult(deleted=deleted, skipped=tuple(skipped), files_deleted=files)


def prune_snapshot_files(
    engine: Engine, folder: Path, *, now: dt.datetime | None = None, grace_s: float = _FILE_GRACE_S
) -> int:
    """Delete the files in `folder` named `<snapshot_id>.html|.json|.json.tmp` whose snapshot
    row no longer exists, once older than `grace_s` (by modification time). Returns how many."""
    from .tables import snapshots

    try:
        entries = [p for p in Path(folder).iterdir() if p.suffix in _SNAPSHOT_SUFFIXES and p.is_file()]
    except FileNotFoundError:
        return 0
    cutoff = (now.timestamp() if now is not None else time.time()) - grace_s
    old: dict[str, list[Path]] = {}
    for p in entries:
        stem = Path(p.stem).stem if p.suffix == ".tmp" else p.stem  # <id>.json.tmp: an interrupted write
        if not _SNAPSHOT_ID.fullmatch(stem):
            continue
        try:
            if p.stat().st_mtime < cutoff:
                old.setdefault(stem, []).append(p)
        except FileNotFoundError:
            continue
    ids = sorted(old)
    kept: set[str] = set()
    with engine.connect() as conn:
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            kept.update(
                conn.execute(
                    select(snapshots.c.snapshot_id).where(snapshots.c.snapshot_id.in_(chunk))
                ).scalars()
            )
    removed = 0
    for stem in ids:
        if stem in kept:
            continue
        for p in old[stem]:
            try:
                p.unlink()
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def _delete_older(engine: Engine, table: Table, rule: _Rule, cutoff: dt.datetime, batch_size: int) -> int:
    pk = next(iter(table.primary_key.columns))
    from .tables import time_bucket

    where = [table.c[rule.time_column] < cutoff]
    if rule.bucket_column is not None and rule.bucket_column in table.c:
        where.append(table.c[rule.bucket_column] <= time_bucket(cutoff))
    if rule.only_when is not None:
        column, values = rule.only_when
        where.append(table.c[column].in_(values))
    total = 0
    while True:
        ids = select(pk).where(*where).limit(batch_size).scalar_subquery()
        with engine.begin() as conn:
            n = conn.execute(delete(table).where(pk.in_(ids))).rowcount
        total += n
        if n < batch_size:
            return total
