"""References and reports in the store (SQLite and PostgreSQL), and the scheduler's entry point."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
from _drift_helpers import Pool, TableEmbedder, real_pool
from _store_helpers import database_url, request_row
from infersight.monitor.drift import (
    DetectorConfig,
    DriftDetector,
    DriftMetrics,
    ReferencePolicy,
    TextWindow,
    evaluate_window,
    list_references,
    list_reports,
    load_reference,
    load_report,
    save_reference,
    traffic_window,
)
from infersight.monitor.drift._policy import CONFIGURED_REFERENCE
from infersight.monitor.drift._references import first_requests_after
from infersight.monitor.drift.errors import ReferenceNotFound
from infersight.monitor.store import connect, upgrade
from infersight.monitor.store.tables import requests
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, insert, select

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
VERSION = "mixtral_banking_fp32-v1.0"


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    e = connect(database_url(request, tmp_path))
    upgrade(e)
    yield e  # type: ignore[misc]
    e.dispose()


@pytest.fixture(scope="module")
def pool() -> Pool:
    return real_pool()


def _insert_traffic(
    engine: Engine,
    prompts: list[str],
    responses: list[str | None],
    *,
    start: dt.datetime,
    version: str = VERSION,
    first_id: int = 0,
) -> None:
    rows = [
        request_row(first_id + i, at=start + dt.timedelta(seconds=i), version=version, prompt=p, response=r)
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]
    with engine.begin() as conn:
        conn.execute(insert(requests), rows)


def test_a_reference_is_versioned_per_name_with_its_texts_and_embeddings(engine: Engine, pool: Pool) -> None:
    detector = DriftDetector(TableEmbedder(pool))
    window = TextWindow.of(
        pool.banking_texts[:50], [pool.banking_texts[100 + i] if i % 2 else None for i in range(50)]
    )
    embedded = detector.embed(window)[0]
    first = save_reference(
        engine,
        "banking",
        window,
        model_version=VERSION,
        source="file",
        source_detail="ref.jsonl",
        embedded=embedded,
        embedder=detector.embedder_name,
    )
    second = save_reference(
        engine, "banking", TextWindow.of(pool.banking_texts[50:90]), model_version="v2", source="file"
    )
    assert (first.version, second.version) == (1, 2)
    latest = load_reference(engine, "banking")
    assert latest.info.version == 2 and latest.embedded is None and len(latest.window.prompts) == 40
    old = load_reference(engine, "banking", version=1, embedder=detector.embedder_name)
    assert old.window.prompts == window.prompts and old.window.responses == window.responses
    assert old.embedded is not None
    np.testing.assert_array_equal(old.embedded.prompt_embeddings, embedded.prompt_embeddings)
    np.testing.assert_allclose(old.embedded.relevance, embedded.relevance, rtol=1e-6)
    assert load_reference(engine, "banking", version=1, embedder="another-model").embedded is None
    assert load_reference(engine, model_version=VERSION).info.id == first.id
    assert [r.version for r in list_references(engine)] == [2, 1]
    with pytest.raises(ReferenceNotFound, match="named 'hotels'"):
        load_reference(engine, "hotels")


def test_references_from_a_time_range_of_traffic_and_from_the_first_requests_after_a_deploy(
    engine: Engine, pool: Pool
) -> None:
    texts = list(pool.banking_texts[:30])
    _insert_traffic(engine, texts, [None] * 30, start=T0)
    _insert_traffic(
        engine, list(pool.banking_texts[30:40]), ["ok"] * 10, start=T0, version="v2", first_id=100
    )
    window = traffic_window(
        engine, model_version=VERSION, since=T0 + dt.timedelta(seconds=5), until=T0 + dt.timedelta(seconds=15)
    )
    assert window.prompts == tuple(texts[5:15]) and window.responses == ()
    after = first_requests_after(engine, model_version="v2", after=T0 + dt.timedelta(seconds=2), n=4)
    assert after.prompts == tuple(pool.banking_texts[32:36]) and after.responses == ("ok",) * 4
    info = save_reference(engine, "post-deploy", after, model_version="v2", source="deploy")
    assert info.n_texts == 4 and info.n_responses == 4


def test_evaluate_window_stores_the_report_fills_relevance_and_sets_the_gauges(
    engine: Engine, pool: Pool
) -> None:
    detector = DriftDetector(TableEmbedder(pool), DetectorConfig())
    ref_window = TextWindow.of(pool.banking_texts[:500], pool.banking_texts[500:1000])
    stored = save_reference(
        engine,
        "banking",
        ref_window,
        model_version=VERSION,
        source="file",
        embedded=detector.embed(ref_window)[0],
        embedder=detector.embedder_name,
    )
    prompts = list(pool.banking_texts[1000:1270]) + list(pool.hotel_texts[:30])
    responses: list[str | None] = [*pool.banking_texts[1270:1540], *pool.hotel_texts[30:50], *([None] * 10)]
    _insert_traffic(engine, prompts, responses, start=T0)
    registry = CollectorRegistry()
    metrics = DriftMetrics(registry)
    until = T0 + dt.timedelta(minutes=10)
    report = evaluate_window(
        engine,
        detector=detector,
        model_version=VERSION,
        reference="banking",
        since=T0,
        until=until,
        model="mixtral_banking",
        metrics=metrics,
    )
    assert report.drifted and report.n_current == 300
    assert report.context.reference_name == "banking" and report.context.reference_version == stored.version
    summaries = list_reports(engine, model_version=VERSION)
    assert len(summaries) == 1 and summaries[0]["drift"] is True
    assert load_report(engine, summaries[0]["id"]) == {"id": summaries[0]["id"], **json.loads(report.dumps())}
    with engine.connect() as conn:
        scored = (
            conn.execute(select(requests.c.relevance).where(requests.c.relevance.is_not(None)))
            .scalars()
            .all()
        )
    assert len(scored) == 290
    labels = {"model": "mixtral_banking", "model_version": VERSION}
    assert registry.get_sample_value("infersight_drift_detected", {**labels, "field": "prompt"}) == 1.0
    assert registry.get_sample_value("infersight_drift_p_value", {**labels, "field": "prompt"}) < 0.05
    assert registry.get_sample_value("infersight_drift_novelty_rate", {**labels, "field": "prompt"}) > 0.05
    assert registry.get_sample_value("infersight_relevance_score_count", labels) == 290
    assert registry.get_sample_value("infersight_relevance_mean", labels) == pytest.approx(
        float(np.mean(scored)), abs=1e-5
    )
    # a second evaluation of the same window scores no request twice
    evaluate_window(
        engine,
        detector=detector,
        model_version=VERSION,
        reference=None,
        since=T0,
        until=until,
        model="mixtral_banking",
        metrics=metrics,
    )
    assert registry.get_sample_value("infersight_relevance_score_count", labels) == 290
    assert len(list_reports(engine)) == 2


def test_the_reference_policy_stores_the_configured_file_once_else_each_versions_first_requests(
    engine: Engine, pool: Pool, tmp_path: Path
) -> None:
    detector = DriftDetector(TableEmbedder(pool), config=DetectorConfig())
    # without a configured file: nothing until the version's first `window` requests are in
    policy = ReferencePolicy(engine, detector, window=20)
    _insert_traffic(engine, list(pool.banking_texts[:10]), [None] * 10, start=T0)
    assert policy.reference_for(VERSION) is None and policy.stored_for(VERSION) is None
    _insert_traffic(
        engine, list(pool.banking_texts[10:30]), [None] * 20, start=T0 + dt.timedelta(seconds=10), first_id=10
    )
    stored = policy.reference_for(VERSION)
    assert stored is not None and stored.info.name == f"{VERSION}-baseline" and stored.info.source == "deploy"
    assert stored.window.prompts == tuple(pool.banking_texts[:20])
    again = policy.stored_for(VERSION)
    assert again is not None and again.info.id == stored.info.id
    # a configured file: every version is tested against it, stored once while its texts are unchanged
    path = tmp_path / "reference.jsonl"
    path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in pool.hotel_texts[:25]))
    configured = ReferencePolicy(engine, detector, window=20, configured_path=path)
    configured.store_configured()
    configured.store_configured()
    assert configured.configured == CONFIGURED_REFERENCE
    files = [r for r in list_references(engine) if r.name == CONFIGURED_REFERENCE]
    assert len(files) == 1 and files[0].source == "file" and files[0].model_version == "*"
    for version in (VERSION, "a-version-never-seen"):
        chosen = configured.reference_for(version)
        assert chosen is not None and chosen.window.prompts == tuple(pool.hotel_texts[:25])
