"""Snapshots keep the evidence of one version, privately, for as long as retention says,
and the post-deploy analysis records what its rollback really did: the requests of the
version concerned only, files with mode 0600, retention deleting the files with their rows,
and the analysis state written once the rollback's outcome is known (on the REAL runtime)."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _tiny_registry import tiny_registry
from infersight.alerts import ActionRunner, RuntimeControl, take_snapshot
from infersight.alerts.actions.runner import FAILURE_ALERT
from infersight.alerts.rules.rules import ActionSpec
from infersight.monitor.store import RetentionPolicy, enforce_retention
from infersight.monitor.store.tables import alerts, deploy_analyses, requests, snapshots
from sqlalchemy import Engine, insert, select
from test_alerts_support import Clock, database

OLD, NEW = "mixtral_tiny_fp32-v1.0", "mixtral_tiny_fp32-v1.1"
T0 = dt.datetime(2026, 6, 1, 8, tzinfo=dt.UTC)


@pytest.fixture
def db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


def _requests(
    engine: Engine, start: dt.datetime, n: int, *, versions: tuple[str, ...], errors: int = 0
) -> None:
    """`n` requests a second apart, cycling through `versions`; the first `errors` failed."""
    with engine.begin() as conn:
        conn.execute(
            insert(requests),
            [
                {
                    "request_id": f"{start.timestamp()}-{i}",
                    "model": "tiny",
                    "model_version": versions[i % len(versions)],
                    "started_at": start + dt.timedelta(seconds=i),
                    "duration_s": 0.1,
                    "error_type": "GenerationFailed" if i < errors else None,
                    "prompt": f"question {i} to {versions[i % len(versions)]}",
                    "response": "answer",
                    "source": "engine",
                    "relevance": 0.6,
                }
                for i in range(n)
            ],
        )


def test_a_snapshot_about_a_version_keeps_only_that_versions_requests(db: Engine, tmp_path: Path) -> None:
    _requests(db, T0, 40, versions=(OLD, NEW))  # both versions served side by side (a canary)
    runner = ActionRunner(db, data_dir=tmp_path, clock=Clock())
    # an alert about OLD while nothing is under control: the alert's version is the one concerned
    out = runner.run(ActionSpec("snapshot", (("requests", 10),)), trigger="rule", alertname="ErrorRateSpike",
                     labels={"model_version": OLD})  # fmt: skip
    content = json.loads(Path(out.detail["path"]).with_suffix(".json").read_text())
    assert out.detail["requests"] == 10 and content["model_version"] == OLD
    assert {r["model_version"] for r in content["requests"]} == {OLD}
    assert all(NEW not in r["prompt"] for r in content["requests"])
    by_hand = take_snapshot(db, data_dir=tmp_path, requests_n=100, trigger="manual", reason="look",
                            now=T0, model_version=NEW)  # fmt: skip
    assert by_hand.request_count == 20  # all of NEW's, none of OLD's


def test_snapshot_files_are_readable_by_the_service_user_only(db: Engine, tmp_path: Path) -> None:
    _requests(db, T0, 5, versions=(OLD,))
    previous = os.umask(0o022)  # the usual umask: files would be world-readable by default
    try:
        snap = take_snapshot(db, data_dir=tmp_path, requests_n=5, trigger="manual", reason="look",
                             now=T0, model_version=OLD)  # fmt: skip
    finally:
        os.umask(previous)
    for path in (snap.html_path, snap.json_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(snap.html_path.parent.stat().st_mode) & 0o077 == 0


def test_retention_deletes_snapshot_files_with_their_rows(db: Engine, tmp_path: Path) -> None:
    _requests(db, T0, 5, versions=(OLD,))
    old = take_snapshot(db, data_dir=tmp_path, requests_n=5, trigger="alert", reason="old",
                        now=T0, model_version=OLD)  # fmt: skip
    later = T0 + dt.timedelta(days=100)
    kept = take_snapshot(db, data_dir=tmp_path, requests_n=5, trigger="alert", reason="recent",
                         now=later, model_version=OLD)  # fmt: skip
    notes = tmp_path / "snapshots" / "notes.json"  # not a snapshot's file: never touched
    notes.write_text("{}")
    for path in (old.html_path, old.json_path, notes):  # written 100 days before "now", as in production
        os.utime(path, (T0.timestamp(), T0.timestamp()))
    result = enforce_retention(db, RetentionPolicy(snapshots_days=90, requests_days=None), now=later,
                               snapshot_dir=tmp_path / "snapshots")  # fmt: skip
    assert result.deleted["snapshots"] == 1 and result.files_deleted == 2
    assert not old.html_path.exists() and not old.json_path.exists()
    assert kept.html_path.exists() and kept.json_path.exists()  # its row is still there
    assert notes.exists()
    with db.connect() as conn:
        assert [r.snapshot_id for r in conn.execute(select(snapshots))] == [kept.snapshot_id]
    # a file of a snapshot being written right now (no row yet) is left alone
    young = tmp_path / "snapshots" / "20270515T080000Z-0000beef.json.tmp"
    young.write_text("{}")
    assert (
        enforce_retention(
            db, RetentionPolicy(snapshots_days=None), snapshot_dir=tmp_path / "snapshots"
        ).files_deleted
        == 0
    )
    assert young.exists()


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    """Its own deploy history per test."""
    return tiny_registry(tmp_path / "models", (OLD, NEW))


def _analyze_until_rollback(db: Engine, tmp_path: Path, runtime: Any, deployed_at: dt.datetime) -> Any:
    from infersight.alerts import AnalysisPolicy, DeployAnalyzer, StoreVersionMetrics

    clock = Clock(deployed_at.timestamp())
    policy = AnalysisPolicy(window_s=600, interval_s=60, baseline_s=600, max_failed_checks=2, min_requests=20)
    runner = ActionRunner(db, data_dir=tmp_path, control=RuntimeControl(runtime), clock=clock)
    analyzer = DeployAnalyzer(db, StoreVersionMetrics(db), runner, policy=policy, clock=clock)
    _requests(db, deployed_at - dt.timedelta(seconds=300), 60, versions=(OLD,))
    analysis_id = analyzer.on_deploy(NEW, OLD, deployed_at)
    _requests(db, deployed_at + dt.timedelta(seconds=1), 60, versions=(NEW,), errors=30)
    checks = []
    for _ in range(2):
        clock.advance(61)
        checks += analyzer.tick()
    with db.connect() as conn:
        row = conn.execute(select(deploy_analyses).where(deploy_analyses.c.id == analysis_id)).one()
    return checks[-1], row


def test_analysis_state_says_the_rollback_failed_when_it_did(
    db: Engine, tmp_path: Path, registry: Path
) -> None:
    from infersight.engine.registry import Registry
    from infersight.engine.runtime import Runtime

    runtime = Runtime(Registry(registry), max_batch_size=2, max_seq_len=64, max_prompt_tokens=16)
    runtime.start(OLD)  # NEW was never served here: there is no previous good version to go back to
    try:
        check, row = _analyze_until_rollback(db, tmp_path, runtime, T0)
        assert check.verdict == "failed" and check.rollback.state == "failed"
        assert row.state == "rollback_failed" and runtime.serving_version == OLD
        with db.connect() as conn:
            names = {r.alertname for r in conn.execute(select(alerts))}
        assert {"PostDeployRegression", FAILURE_ALERT} <= names
    finally:
        runtime.stop(drain=False)


def test_analysis_state_says_rolled_back_only_once_the_real_runtime_has(
    db: Engine, tmp_path: Path, registry: Path
) -> None:
    from infersight.engine.registry import Registry
    from infersight.engine.runtime import Runtime

    runtime = Runtime(Registry(registry), max_batch_size=2, max_seq_len=64, max_prompt_tokens=16)
    runtime.start(OLD)
    seen_during_rollback: list[str] = []

    def on_event(event: Any) -> None:  # on the engine's thread, as the swap completes
        if type(event).__name__ == "VersionDeployed" and event.reason == "rollback":
            with db.connect() as conn:
                seen_during_rollback.extend(conn.execute(select(deploy_analyses.c.state)).scalars())

    try:
        runtime.deploy(NEW)
        runtime.subscribe(on_event)
        check, row = _analyze_until_rollback(db, tmp_path, runtime, T0)
        assert check.rollback.state == "succeeded" and runtime.serving_version == OLD
        assert seen_during_rollback == ["running"]  # nothing claimed before the outcome was known
        assert row.state == "rolled_back"
    finally:
        runtime.stop(drain=False)
