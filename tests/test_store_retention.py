"""Retention deletes what the policy lets go, in batches, and keeps the rest."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from _store_helpers import database_url, request_row
from infersight.monitor.store import RetentionPolicy, connect, enforce_retention, upgrade
from infersight.monitor.store.tables import requests, snapshots
from sqlalchemy import func, insert, select

NOW = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return database_url(request, tmp_path)


def _count(engine, table) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_old_requests_and_snapshots_go_recent_ones_stay(url: str) -> None:
    engine = connect(url)
    upgrade(engine)
    old = [request_row(i, at=NOW - dt.timedelta(days=20, seconds=i)) for i in range(120)]
    new = [request_row(1000 + i, at=NOW - dt.timedelta(days=1)) for i in range(30)]
    with engine.begin() as conn:
        conn.execute(insert(requests), old + new)
        conn.execute(
            insert(snapshots),
            [
                {
                    "snapshot_id": sid,
                    "taken_at": at,
                    "trigger": "manual",
                    "reason": "r",
                    "model_version": None,
                    "request_count": 0,
                    "path": None,
                    "content": "{}",
                }
                for sid, at in (("old", NOW - dt.timedelta(days=100)), ("new", NOW - dt.timedelta(days=2)))
            ],
        )
    result = enforce_retention(
        engine, RetentionPolicy(requests_days=14, snapshots_days=90), now=NOW, batch_size=50
    )
    assert result.deleted["requests"] == 120
    assert result.deleted["snapshots"] == 1
    assert _count(engine, requests) == 30
    with engine.connect() as conn:
        assert conn.execute(select(snapshots.c.snapshot_id)).scalars().all() == ["new"]
    engine.dispose()


def test_a_null_retention_keeps_rows_forever(tmp_path: Path) -> None:
    engine = connect(f"sqlite:///{tmp_path}/db.sqlite")
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(insert(requests), [request_row(1, at=NOW - dt.timedelta(days=3650))])
    result = enforce_retention(engine, RetentionPolicy(requests_days=None), now=NOW)
    assert "requests" not in result.deleted
    assert _count(engine, requests) == 1
    engine.dispose()


def test_every_retention_rule_names_a_table_of_the_schema() -> None:
    # Catches a renamed table in alerts/ or monitor/drift/ that retention would silently miss.
    engine = connect("sqlite:///:memory:")
    from infersight.monitor.store.tables import metadata

    metadata.create_all(engine)
    assert enforce_retention(engine, RetentionPolicy(), now=NOW).skipped == ()


def test_a_nonpositive_retention_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="requests_days"):
        RetentionPolicy(requests_days=0)
