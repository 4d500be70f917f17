"""Incident data leaves the store as JSONL a fine-tuning job can read: every kind of export
(drifted, novel, failed, snapshot) on SQLite and PostgreSQL with flags taken from a real
drift report, the service's redact hook on every text, and the CLI's answers to bad input."""

from __future__ import annotations

import datetime as dt
import json
import re
import stat
from pathlib import Path

import pytest
from _drift_helpers import Pool, TableEmbedder, real_pool
from _store_helpers import database_url, request_row
from infersight.alerts import take_snapshot
from infersight.monitor.cli import main
from infersight.monitor.dataset import (
    DatasetQuery,
    RedactorInvalid,
    export_dataset,
    iter_dataset,
    load_redactor,
    parse_since,
)
from infersight.monitor.dataset._export import InvalidSince, UnknownKind
from infersight.monitor.drift import DetectorConfig, DriftDetector, TextWindow
from infersight.monitor.drift._report import ReportContext, save_report
from infersight.monitor.store import connect, upgrade
from infersight.monitor.store.tables import requests
from sqlalchemy import Engine, insert

T0 = dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC)
V1, V2 = "mixtral_banking_fp32-v1.0", "mixtral_banking_fp32-v1.1"
EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


def mask_emails(text: str) -> str:
    """The kind of hook a deployment configures (`redact: test_dataset_export:mask_emails`)."""
    return EMAIL.sub("<email>", text)


def refuse_everything(text: str) -> str:
    raise RuntimeError("the redaction service is down")


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    e = connect(database_url(request, tmp_path))
    upgrade(e)
    yield e  # type: ignore[misc]
    e.dispose()


@pytest.fixture(scope="module")
def pool() -> Pool:
    return real_pool()


def _incident(engine: Engine, pool: Pool, tmp_path: Path) -> dict[str, list[str]]:
    """V2 answered 40 banking questions (09:00), then 20 hotel questions (09:10, a topic
    shift the real drift test flags), 3 of them failed; V1's traffic is another version's."""
    banking, hotels = list(pool.banking_texts[:40]), list(pool.hotel_texts[:20])
    rows = [request_row(i, at=T0 + dt.timedelta(seconds=i), version=V2, prompt=t, response="ok", relevance=0.7)
            for i, t in enumerate(banking)]  # fmt: skip
    shift = T0 + dt.timedelta(minutes=10)
    rows += [request_row(100 + i, at=shift + dt.timedelta(seconds=i), version=V2, prompt=t, response="hm",
                         relevance=0.2, error_type="GenerationFailed" if i < 3 else None)
             for i, t in enumerate(hotels)]  # fmt: skip
    rows.append(
        request_row(
            900, at=shift, version=V1, prompt="write to ann@example.org", response="done", relevance=None
        )
    )
    rows.append(
        request_row(901, at=shift, version=V2, prompt=None, response=None, relevance=None)
    )  # text not sampled
    with engine.begin() as conn:
        conn.execute(insert(requests), rows)
    detector = DriftDetector(TableEmbedder(pool), DetectorConfig())
    ctx = ReportContext(created_at=(shift + dt.timedelta(minutes=1)).isoformat(), model_version=V2,
                        since=shift.isoformat(), until=(shift + dt.timedelta(seconds=30)).isoformat())  # fmt: skip
    report = detector.score(
        TextWindow.of(list(pool.banking_texts[200:400])), TextWindow.of(hotels), context=ctx
    )
    assert report.drifted
    save_report(engine, report, since=shift, until=shift + dt.timedelta(seconds=30))
    snap = take_snapshot(engine, data_dir=tmp_path, requests_n=5, trigger="manual", reason="look",
                         now=T0 + dt.timedelta(minutes=1), model_version=V2)  # fmt: skip
    assert snap.request_count == 5
    novel = [x.text for e in report.explanations for x in e.novelty.examples]
    return {"banking": banking, "hotels": hotels, "novel": novel}


def _export(engine: Engine, kind: str | None, **kw: object) -> list[dict[str, object]]:
    return list(iter_dataset(engine, DatasetQuery(V2, kind, **kw)))  # type: ignore[arg-type]


def test_each_kind_exports_its_requests_with_the_drift_reports_flags(
    engine: Engine, pool: Pool, tmp_path: Path
) -> None:
    seen = _incident(engine, pool, tmp_path)
    everything = _export(engine, None)
    assert [r["prompt"] for r in everything] == seen["banking"] + seen[
        "hotels"
    ]  # V2's, with text, in time order
    first = everything[0]
    assert first["answer"] == "ok" and first["model_version"] == V2 and first["relevance"] == 0.7
    assert first["messages"] == [{"role": "user", "content": seen["banking"][0]},
                                 {"role": "assistant", "content": "ok"}]  # fmt: skip
    assert first["started_at"] == T0.isoformat().replace("+00:00", "Z")
    assert not first["novel"] and not first["drifted_window"]

    drifted = _export(engine, "drifted")
    assert [r["prompt"] for r in drifted] == seen["hotels"]  # the report's window, 09:10:00-09:10:30
    assert all(r["drifted_window"] for r in drifted)

    novel = _export(engine, "novel")
    assert seen["novel"] and sorted(r["prompt"] for r in novel) == sorted(seen["novel"])
    assert all(r["novel"] and isinstance(r["novelty"], float) and r["novelty"] > 0 for r in novel)
    assert any(r["witness"] for r in drifted)  # the report's highest-witness texts are marked

    failed = _export(engine, "failed")
    assert [r["prompt"] for r in failed] == seen["hotels"][:3]
    assert {r["error_type"] for r in failed} == {"GenerationFailed"}

    in_snapshot = _export(engine, "snapshot")
    assert [r["prompt"] for r in in_snapshot] == seen["hotels"][-5:]  # the snapshot's last 5 requests
    assert all(r["in_snapshot"] for r in in_snapshot)

    since = _export(engine, None, since=T0 + dt.timedelta(minutes=5))
    assert [r["prompt"] for r in since] == seen["hotels"]


def test_the_redact_hook_applies_to_every_exported_text_and_a_failing_hook_drops_the_text(
    engine: Engine, tmp_path: Path
) -> None:
    with engine.begin() as conn:
        conn.execute(insert(requests), [
            request_row(1, at=T0, version=V2, prompt="my mail is bob@example.com", response="mail bob@example.com",
                        system_prompt="you answer for ann@example.org"),  # a chat's system messages
        ])  # fmt: skip
    out = export_dataset(engine, DatasetQuery(V2), tmp_path / "out.jsonl",
                         redact=load_redactor("test_dataset_export:mask_emails"))  # fmt: skip
    text = out.path.read_text()
    assert "example.com" not in text and "example.org" not in text
    row = json.loads(text)
    assert row["prompt"] == "my mail is <email>" and row["answer"] == "mail <email>"
    assert row["system_prompt"] == "you answer for <email>"
    assert row["messages"][0] == {"role": "system", "content": "you answer for <email>"}
    assert stat.S_IMODE(out.path.stat().st_mode) == 0o600  # user text: the owner's only

    refused = export_dataset(engine, DatasetQuery(V2), tmp_path / "refused.jsonl", redact=refuse_everything)
    row = json.loads(refused.path.read_text())
    assert refused.redaction_failed == 1 and row["redaction_failed"]
    assert row["prompt"] is None and row["answer"] is None and row["messages"] is None
    assert row["system_prompt"] is None
    assert "bob" not in refused.path.read_text() and "ann" not in refused.path.read_text()  # never unredacted


def test_bad_queries_are_typed_errors() -> None:
    with pytest.raises(UnknownKind, match="valid kinds: drifted, novel, failed, snapshot, collected"):
        DatasetQuery(V2, "weird")
    with pytest.raises(InvalidSince):
        parse_since("yesterday-ish")
    assert parse_since("2h", now=T0) == T0 - dt.timedelta(hours=2)
    assert parse_since("2026-11-20T09:00:00") == T0
    with pytest.raises(RedactorInvalid, match=r"package\.module:function"):
        load_redactor("no_colon_here")
    with pytest.raises(RedactorInvalid, match="ModuleNotFoundError"):
        load_redactor("infersight_no_such_module:f")


def _cli_store(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    e = connect(f"sqlite:///{data}/infersight.sqlite")
    upgrade(e)
    with e.begin() as conn:
        conn.execute(
            insert(requests), [request_row(1, at=T0, version=V2, prompt="call me at ann@example.org")]
        )
    e.dispose()
    return data


def test_cli_export_writes_jsonl_with_the_configs_redact_hook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _cli_store(tmp_path)
    cfg = tmp_path / "infersight.yaml"
    cfg.write_text(f"data_dir: {data}\nredact: test_dataset_export:mask_emails\n")
    out = tmp_path / "out.jsonl"
    assert main(["dataset", "export", "--version", V2, "--config", str(cfg), str(out)]) == 0
    assert json.loads(out.read_text())["prompt"] == "call me at <email>"
    assert capsys.readouterr().out.strip() == f"wrote 1 requests of {V2} with text to {out}"


def test_cli_export_through_a_planted_symlink_or_open_temp_file_neither_follows_nor_exposes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _cli_store(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out.jsonl"
    (tmp_path / "out.jsonl.tmp").symlink_to(victim)  # what the old fixed temp name would follow
    assert main(["dataset", "export", "--version", V2, "--data-dir", str(data), str(out)]) == 0
    assert victim.read_text() == "keep me\n"
    assert "ann@example.org" in out.read_text() and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" in p.name) == ["out.jsonl.tmp"]

    (tmp_path / "out.jsonl.tmp").unlink()
    (tmp_path / "out.jsonl.tmp").write_text("")  # a world-readable file left at the old temp name
    (tmp_path / "out.jsonl.tmp").chmod(0o644)
    out.unlink()
    assert main(["dataset", "export", "--version", V2, "--data-dir", str(data), str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_cli_export_with_no_matching_rows_writes_an_empty_file_and_exits_0_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _cli_store(tmp_path)
    out = tmp_path / "none.jsonl"
    assert (
        main(["dataset", "export", "--version", V2, "--kind", "failed", "--data-dir", str(data), str(out)])
        == 0
    )
    assert out.read_text() == ""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: no requests of") and "kind failed" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--kind", "weird"],
            "unknown kind 'weird'; valid kinds: drifted, novel, failed, snapshot, collected",
        ),
        (["--since", "last tuesday"], "since 'last tuesday' is neither an ISO 8601 time"),
    ],
)
def test_cli_export_refuses_an_unknown_kind_or_a_bad_since_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    data = _cli_store(tmp_path)
    out = tmp_path / "out.jsonl"
    assert main(["dataset", "export", "--version", V2, *flags, "--data-dir", str(data), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("infersight dataset: error: --") and message in err
    assert not out.exists()


def test_cli_export_of_a_missing_database_or_a_bad_redact_hook_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.jsonl"
    assert (
        main(["dataset", "export", "--version", V2, "--data-dir", str(tmp_path / "nothing"), str(out)]) == 2
    )
    assert "no infersight database at" in capsys.readouterr().err
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"data_dir: {_cli_store(tmp_path)}\nredact: infersight_no_such_module:f\n")
    assert main(["dataset", "export", "--version", V2, "--config", str(cfg), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "redact" in err
