"""Retention: old rows are deleted on a schedule; evidence people still need is kept.

Each rule names a table, its time column and, where only some rows may go, a condition
(a delivered notification may go; a dead letter stays until a person deals with it).
Deletes run in bounded batches, each its own transaction, so a large backlog never holds
SQLite's write lock for long. A rule whose table is not in the schema is reported in
`RetentionResult.skipped` (tests assert there are none).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine, Table, delete, select

__all__ = ["RetentionPolicy", "RetentionResult", "enforce_retention"]


@dataclass(frozen=True)
class RetentionPolicy:
    """How long rows are kept, in days; None keeps them forever."""

    requests_days: float | None = 14
    drift_reports_days: float | None = 90
    alert_history_days: float | None = 90
    notifications_days: float | None = 30  # delivered outbox rows and the notification log
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


@dataclass(frozen=True)
class _Rule:
    policy_field: str
    table: str
    time_column: str
    only_when: tuple[str, tuple[str, ...]] | None = None  # (column, values)


_RULES = (
    _Rule("requests_days", "requests", "started_at"),
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
) -> RetentionResult:
    from .schema import metadata  # every area's tables (imported late: they import this package)

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
    return RetentionResult(deleted=deleted, skipped=tuple(skipped))


def _delete_older(engine: Engine, table: Table, rule: _Rule, cutoff: dt.datetime, batch_size: int) -> int:
    pk = next(iter(table.primary_key.columns))
    where = [table.c[rule.time_column] < cutoff]
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
