"""Alembic migrations: in step with the code's metadata, idempotent, and never losing rows."""

from __future__ import annotations

import datetime as dt
import shutil
import threading
from pathlib import Path

import pytest
from _store_helpers import database_url, request_row
from infersight.monitor.store import connect, current_revision, head_revision, upgrade
from infersight.monitor.store.database import SchemaTooNew, schema_diff
from infersight.monitor.store.tables import (
    by_start,
    deploys,
    metadata,
    requests,
    snapshots,
    started_in,
    time_bucket,
)
from sqlalchemy import MetaData, Table, func, insert, select, text

MIGRATIONS = Path(__file__).resolve().parents[1] / "monitor" / "store" / "migrations"
NOW = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return database_url(request, tmp_path)


def test_migrations_create_exactly_the_tables_of_the_metadata(url: str) -> None:
    engine = connect(url)
    assert current_revision(engine) is None
    assert upgrade(engine) == head_revision()
    diff = schema_diff(engine)
    assert diff == [], (
        "migrations and metadata differ: run `python -m infersight.monitor.store.migrations.regenerate`\n"
        + "\n".join(map(str, diff))
    )
    with engine.connect() as conn:
        for name in metadata.tables:
            conn.execute(text(f'SELECT count(*) FROM "{name}"')).scalar_one()
    engine.dispose()


def test_upgrade_on_a_current_database_keeps_every_row(url: str) -> None:
    engine = connect(url)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(insert(requests), [request_row(i, at=NOW) for i in range(50)])
        conn.execute(
            insert(deploys),
            [{"at": NOW, "from_version": None, "to_version": "v", "reason": "start", "outcome": "deployed"}],
        )
    assert upgrade(engine) == head_revision()
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(requests)).scalar_one() == 50
        assert conn.execute(select(func.count()).select_from(deploys)).scalar_one() == 1
    engine.dispose()


_NEXT_REVISION = '''"""a later release: requests gain a column, snapshots a NOT NULL one with a default"""

import sqlalchemy as sa
from alembic import op

revision = "9001"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("tenant", sa.String(64), nullable=True))
        batch.alter_column("error_type", type_=sa.String(512), existing_nullable=True)
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("pinned")
    with op.batch_alter_table("requests") as batch:
        batch.alter_column("error_type", type_=sa.String(256), existing_nullable=True)
        batch.drop_column("tenant")
'''


def test_upgrade_from_an_older_head_with_rows_keeps_them(url: str, tmp_path: Path) -> None:
    # A copy of the shipped migrations plus one later revision that alters tables the way
    # a release would (on SQLite: copy-and-move of the whole table), run over real rows.
    scripts = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "9001_later_release.py").write_text(_NEXT_REVISION.format(head=head_revision()))

    engine = connect(url)
    upgrade(engine)  # the shipped head
    rows = [request_row(i, at=NOW + dt.timedelta(seconds=i)) for i in range(200)]
    with engine.begin() as conn:
        conn.execute(insert(requests), rows)
        conn.execute(
            insert(snapshots),
            [
                {
                    "snapshot_id": "s1",
                    "taken_at": NOW,
                    "trigger": "manual",
                    "reason": "by hand",
                    "model_version": None,
                    "request_count": 0,
                    "path": None,
                    "content": "{}",
                }
            ],
        )
    assert upgrade(engine, script_location=scripts) == "9001"
    with engine.connect() as conn:
        kept = conn.execute(
            text("SELECT request_id, prompt, duration_s, tenant FROM requests ORDER BY id")
        ).all()
        pinned = conn.execute(text("SELECT snapshot_id, pinned FROM snapshots")).all()
    assert [r.request_id for r in kept] == [r["request_id"] for r in rows]
    assert [r.prompt for r in kept] == [r["prompt"] for r in rows]
    assert [r.duration_s for r in kept] == pytest.approx([r["duration_s"] for r in rows])
    assert all(r.tenant is None for r in kept)
    assert [(p.snapshot_id, bool(p.pinned)) for p in pinned] == [("s1", False)]
    engine.dispose()


def test_a_database_migrated_by_a_newer_release_is_refused(url: str) -> None:
    engine = connect(url)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    with pytest.raises(SchemaTooNew, match="ffff"):
        upgrade(engine)
    engine.dispose()


def test_two_replicas_upgrading_at_once_both_succeed(postgres_url: str) -> None:
    results: list[object] = []

    def start() -> None:
        engine = connect(postgres_url)
        try:
            results.append(upgrade(engine))
        except Exception as exc:  # recorded for the assertion
            results.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [head_revision(), head_revision()]


def test_upgrading_to_time_buckets_keeps_every_request_and_buckets_its_start(url: str) -> None:
    # rows written before 0010 (no started_bucket) get the bucket of their stored start
    # time, 10-second boundaries included, and the time queries still find them
    engine = connect(url)
    upgrade(engine, revision="0009_request_shape")
    old = Table("requests", MetaData(), autoload_with=engine)
    sqlite = engine.dialect.name == "sqlite"
    starts = [NOW + dt.timedelta(seconds=s) for s in (-0.000001, 0, 9.999999, 10, 3600.5)]
    starts += [NOW + dt.timedelta(seconds=37 * i + i / 7) for i in range(100)]
    rows = []
    for i, at in enumerate(starts):
        row = request_row(i, at=at.replace(tzinfo=None) if sqlite else at)
        rows.append({k: v for k, v in row.items() if k in old.c})
    with engine.begin() as conn:
        conn.execute(insert(old), rows)
    assert upgrade(engine) == head_revision()
    assert schema_diff(engine) == []
    with engine.connect() as conn:
        kept = conn.execute(
            select(requests.c.request_id, requests.c.started_at, requests.c.started_bucket).order_by(
                requests.c.id
            )
        ).all()
        since, until = NOW, NOW + dt.timedelta(seconds=10)
        window = conn.execute(
            select(requests.c.request_id).where(*started_in(since, until)).order_by(*by_start())
        ).scalars()
        window_ids = list(window)
    engine.dispose()
    assert [r.request_id for r in kept] == [r["request_id"] for r in rows]
    assert [r.started_at for r in kept] == starts
    assert [r.started_bucket for r in kept] == [time_bucket(at) for at in starts]
    assert time_bucket(starts[0]) + 1 == time_bucket(starts[1]) == time_bucket(starts[2])
    assert window_ids == ["req-1", "req-5", "req-2"]  # by start, ties (req-5 also starts at NOW) by id
