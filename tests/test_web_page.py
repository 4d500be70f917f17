"""The built-in web page served by the REAL service (`create_app`), in real headless Chromium.

A feeder thread sends InferenceRecords to the service's ingest endpoint while the page is
open; the service's scheduler turns them into timeseries points and the page draws them.
Deploy history is rows in the service's store; the drift report is a `DriftReport` (built
from the drift module's dataclasses, with real hotel utterances) stored with the drift
module's `save_report`, so overview and `/api/v1/drift/{id}` serve it as in production.
Rollback and snapshot go through the real endpoints (no embedded runtime here: the page
must show rollback's 409 refusal; a successful rollback is in test_web_page_rollback.py).
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from infersight.dashboards import web_assets_dir
from infersight.monitor.data import banking77, hotels
from infersight.monitor.records import InferenceRecord
from infersight.monitor.service import ServiceConfig, create_app
from infersight.monitor.service.config import AlertingConfig, CostConfig, ScheduleConfig
from infersight.monitor.store.tables import deploys

from tests._web_page_browser import Browser, serve
from tests.conftest import free_port, require_executable

TOKEN = "page-test-token-0123456789"
MODEL = "mixtral-demo"
XSS = '<img src=x onerror="window.__xss = 1">'
HOTEL = [u.text for u in hotels()]
BANK = [u.text for u in banking77()]


@dataclass
class Live:
    url: str
    app: Any
    sent: list[int]
    report_id: int


def _drift_report(hotel: list[str], bank: list[str]) -> Any:
    """A DriftReport built from the drift module's own result dataclasses (their `to_json()` is
    the shape the page reads), with real hotel utterances as what appeared."""
    from infersight.monitor.drift import DriftReport
    from infersight.monitor.drift._explain import (
        ClusterShare,
        ExampleText,
        FieldExplanation,
        Novelty,
        NoveltyExample,
        Projection,
    )
    from infersight.monitor.drift._report import FieldVerdict, ReportContext, TestResult
    from infersight.monitor.drift._stat_tests import RelevanceComparison, summarize_relevance

    rng = random.Random(11)

    def test(name: str, method: str, score: float, p: float, floor: float) -> TestResult:
        return TestResult(
            "prompt",
            name,
            method,
            score,
            score,
            floor,
            p,
            min(1.0, 2 * p),
            0.05,
            2 * p < 0.05,
            200,
            200,
            1000,
        )

    novel = [NoveltyExample(t, 0.8 - i * 0.02, bank[i]) for i, t in enumerate(hotel[20:24])]
    clusters = (
        ClusterShare(-1, "(new: farther from the reference than its own 1% tail)", 2, 40, 0.01, 0.2, 0.19, 5e-7,
                     2.4e-6, True, (), tuple(hotel[10:13])),
        ClusterShare(3, bank[100], 40, 31, 0.2, 0.155, -0.045, 0.21, 0.63, False, tuple(bank[100:103]), ()),
    )  # fmt: skip
    projection = Projection(
        "pca",
        (0.21, 0.12),
        tuple((rng.gauss(0, 1), rng.gauss(0, 1)) for _ in range(60)),
        tuple(
            (rng.gauss(1.5 if i < 12 else 0, 0.6), rng.gauss(1.0 if i < 12 else 0, 0.8)) for i in range(60)
        ),
        tuple(i < 12 for i in range(60)),
    )
    explanation = FieldExplanation(
        "prompt",
        appeared=tuple(ExampleText(t, 0.011 - i * 0.001) for i, t in enumerate([*hotel[:5], XSS])),
        typical=tuple(ExampleText(t, -0.002) for t in bank[200:203]),
        disappeared=tuple(ExampleText(t, -0.004 + i * 0.001) for i, t in enumerate(bank[:4])),
        clusters=clusters,
        novelty=Novelty(0.2, 0.01, 0.99, 0.57, 40, tuple(novel)),
        projection=projection,
    )
    tests = (
        test("mmd", "mmd2_permutation_exact", 0.0022, 0.006, 1e-4),
        test("novelty", "nn_novelty_conformal_hypergeometric", 0.19, 0.0019, 0.02),
    )
    return DriftReport(
        drifted=True,
        p_value=0.0038,
        score=0.19,
        threshold=0.05,
        method="nn_novelty_conformal_hypergeometric",
        correction="holm(2)",
        n_reference=200,
        n_current=200,
        tests=tests,
        fields=(FieldVerdict("prompt", True, 0.0038, 0.0022, 0.2),),
        relevance=RelevanceComparison(
            summarize_relevance(np.array([rng.uniform(0.5, 0.8) for _ in range(200)])),
            summarize_relevance(np.array([rng.uniform(0.2, 0.6) for _ in range(200)])),
        ),
        explanations=(explanation,),
        context=ReportContext(
            created_at=dt.datetime.now(dt.UTC).isoformat(), model="mixtral-demo",
            model_version="mixtral_banking_int8-v1.2", reference_name="banking-validation", reference_version=1,
        ),
    )  # fmt: skip


def _feed(url: str, stop: threading.Event, sent: list[int]) -> None:
    """POST a batch of records every 0.2 s until stopped (at most 2 minutes)."""
    rng = random.Random(3)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5) as client:
        for batch in range(600):
            if stop.is_set():
                return
            records = [
                InferenceRecord(
                    request_id=f"b{batch}-{i}",
                    model=MODEL,
                    model_version="mixtral_banking_int8-v1.2",
                    started_at=time.time(),
                    duration_s=rng.lognormvariate(-2.0, 0.5),
                    ttft_s=rng.lognormvariate(-3.5, 0.3),
                    prompt_tokens=rng.randint(8, 60),
                    output_tokens=40,
                    error_type={0: "client_error", 1: "cancelled"}.get(i % 10),  # careless clients
                ).to_json()
                for i in range(20)
            ]
            resp = client.post("api/v1/events", json={"events": records})
            assert resp.status_code == 200, resp.text
            sent[0] += len(records)
            stop.wait(0.2)


def _record_deploys(app: Any) -> None:
    now = dt.datetime.now(dt.UTC)
    with app.state.service.db.begin() as conn:
        conn.execute(deploys.insert(), [
            {"at": now - dt.timedelta(hours=2), "from_version": None, "to_version": "mixtral_banking_int8-v1.1",
             "reason": "start", "outcome": "deployed", "detail": None},
            {"at": now - dt.timedelta(minutes=15), "from_version": "mixtral_banking_int8-v1.1",
             "to_version": "mixtral_banking_int8-v1.2", "reason": "deploy", "outcome": "deployed", "detail": None},
        ])  # fmt: skip


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    rules = tmp_path_factory.mktemp("rules") / "rules.yaml"
    rules.write_text(
        "groups: []\nslos:\n"
        "  - {name: answers-within-1s, objective: 0.99, threshold_ms: 1000, window: 30d}\n"
        "  - {name: fast-path, path: fast, objective: 0.999, threshold_ms: 50, window: 30d}\n"
    )
    config = ServiceConfig(
        data_dir=tmp_path_factory.mktemp("service"),
        token=TOKEN,
        model=MODEL,
        schedule=ScheduleConfig(timeseries_s=0.25, timeseries_window_s=10.0),
        alerting=AlertingConfig(rules=rules),
        cost=CostConfig(per_hour=4.10),
    )
    app = create_app(config)
    stop = threading.Event()
    sent = [0]
    with serve(app, free_port()) as url:
        _record_deploys(app)
        from infersight.monitor.drift._report import save_report

        report_id = save_report(app.state.service.db, _drift_report(HOTEL, BANK))
        feeder = threading.Thread(target=_feed, args=(url, stop, sent), name="page-feeder", daemon=True)
        feeder.start()
        try:
            yield Live(url, app, sent, report_id)
        finally:
            stop.set()
            feeder.join(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    b = Browser(require_executable("chromium"), tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


def _points(b: Browser, chart: str, series: str) -> int:
    return int(b.evaluate(
        f"Number(document.querySelector('#{chart} path.series[data-series=\"{series}\"]')?.dataset.points || 0)"
    ))  # fmt: skip


def _open(b: Browser, url: str, **size: int) -> None:
    b.navigate(url + "?refresh=0.5", **size)
    b.wait_for("Number(document.body.dataset.updates || 0) >= 1", what="the first data load")


def test_page_draws_live_latency_and_memory_from_the_service(
    live: Live, browser: Browser, tmp_path: Path
) -> None:
    _open(browser, live.url)
    browser.wait_for(
        "Number(document.querySelector('#chart-latency path.series[data-series=\"p99\"]')?.dataset.points || 0) >= 4",
        what="latency points from ingested records",
    )
    before = _points(browser, "chart-latency", "p99")
    d = browser.evaluate(
        "document.querySelector('#chart-latency path.series[data-series=\"p99\"]').getAttribute('d')"
    )
    assert d.startswith("M") and d.count("L") >= before - 1 >= 3  # gaps (null ticks) start a new M
    for chart, series in [("chart-latency", "p50"), ("chart-latency", "TTFT p95"), ("chart-rps", "requests/s"),
                          ("chart-rps", "client errors/s (not errors)"), ("chart-rps", "hung up/s (not errors)"),
                          ("chart-rss", "RSS")]:  # fmt: skip
        assert _points(browser, chart, series) >= 2, (chart, series)
    # what the clients caused is drawn beside the requests, and is not a server error
    drawn = httpx.get(live.url + "api/v1/timeseries?window=60", timeout=10).json()["series"]
    assert (
        max(v or 0 for v in drawn["client_errors_per_s"]) > 0
        and max(v or 0 for v in drawn["cancelled_per_s"]) > 0
    )
    assert max(v or 0 for v in drawn["errors_per_s"]) == 0
    browser.wait_for(
        f"Number(document.querySelector('#chart-latency path.series[data-series=\"p99\"]').dataset.points) > {before}",
        what="a newer point on the next poll",
    )
    legend = browser.evaluate("document.querySelector('#chart-latency .legend').textContent")
    assert " ms" in legend or " s" in legend
    assert live.sent[0] > 0

    # header: the configured model, health from /readyz's checks, uptime
    assert browser.evaluate("document.getElementById('model').textContent") == MODEL
    assert browser.evaluate("document.getElementById('health').textContent") == "ok"
    assert browser.evaluate("document.getElementById('uptime').textContent").endswith("s")

    # deploy history from the service's store, newest first
    rows = browser.evaluate("[...document.querySelectorAll('#deploys tbody tr')].map(r => r.textContent)")
    assert len(rows) == 2 and "mixtral_banking_int8-v1.2" in rows[0] and "deployed" in rows[0]

    # GPU: drawn when the service's GPU collector runs; otherwise a clear notice
    if live.app.state.service.parts.gpu.enabled:
        browser.wait_for("!!document.querySelector('#chart-gpu-sm path.series')", what="the GPU chart")
    else:
        assert browser.visible("#no-gpu") and "No GPU" in browser.evaluate(
            "document.getElementById('no-gpu').textContent"
        )
        assert not browser.visible("#chart-gpu-sm") and not browser.visible("#chart-gpu-mem")
    assert browser.evaluate("document.getElementById('alerts').textContent").strip() == "No alert is firing."

    png = browser.screenshot(tmp_path / "web_page_service.png")
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert not browser.page_errors()


def test_page_shows_each_slos_error_budget_and_the_cost_per_1k_tokens(live: Live, browser: Browser) -> None:
    _open(browser, live.url)
    browser.wait_for(
        "[...document.querySelectorAll('#slos tbody tr')].some(r => r.textContent.includes('answers-within-1s')"
        " && !r.textContent.includes('no requests'))",
        what="the SLO row with traffic",
    )
    rows = browser.evaluate(
        "[...document.querySelectorAll('#slos tbody tr')].map(r => [...r.cells].map(c => c.textContent))"
    )
    within = next(r for r in rows if r[0] == "answers-within-1s")
    assert within[1] == "99.00% latency" and within[2] == "30d"
    budget_left = float(within[4].rstrip("%"))  # lognormal answers, almost none over 1 s
    assert within[4].endswith("%") and budget_left > 50
    fast = next(r for r in rows if r[0] == "fast-path")
    assert fast[3] == "no requests" and fast[4] == "100%"  # no routing layer labels requests `fast` yet
    browser.wait_for("document.querySelectorAll('#costs tbody tr td.mono').length >= 1", what="a cost row")
    cost = browser.evaluate("[...document.querySelector('#costs tbody tr').cells].map(c => c.textContent)")
    assert cost[0] == "mixtral_banking_int8-v1.2" and float(cost[3]) > 0
    assert not browser.page_errors()


def test_drift_verdict_clicks_through_to_its_explanation(
    live: Live, browser: Browser, tmp_path: Path
) -> None:
    _open(browser, live.url)
    browser.wait_for("document.getElementById('drift-summary').textContent.includes('Drift detected')",
                     what="the latest drift verdict")  # fmt: skip
    assert "banking-validation v1" in browser.evaluate("document.getElementById('drift-summary').textContent")
    assert not browser.visible("#drift-detail")

    browser.click("#drift-open")  # the report quotes users' text: the page asks for the token first
    browser.wait_for("document.getElementById('token-dialog').open", what="the token dialog")
    assert "drift report" in browser.evaluate("document.getElementById('token-action').textContent")
    browser.click("#token-input")
    browser.type_text(TOKEN)
    browser.click("#token-submit")
    body = browser.wait_for(
        f"document.getElementById('drift-detail').dataset.reportId === '{live.report_id}'"
        " && document.getElementById('drift-body').textContent",
        what="the drift explanation",
    )
    for text in HOTEL[:5] + HOTEL[20:24] + HOTEL[10:13]:  # appeared, novel, the new cluster's texts
        assert text in body
    assert "Clusters of the reference" in body and "20%" in body and "nearest reference" in body
    assert "mmd2_permutation_exact" in body and "Prompt–response relevance" in body
    assert XSS in body and browser.evaluate("window.__xss === undefined")  # shown as text, never as markup
    scatter = browser.wait_for("document.querySelector('#drift-body .scatter-svg')?.getAttribute('aria-label')",
                               what="the projection scatter")  # fmt: skip
    assert "60 reference texts, 60 current texts of which 12 novel" in scatter
    assert (
        browser.visible("#drift-detail")
        and browser.evaluate("document.activeElement.id") == "drift-detail-title"
    )

    png = browser.screenshot(tmp_path / "web_page_drift.png")
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert not browser.page_errors()


def _toast(browser: Browser, what: str) -> str:
    return str(browser.wait_for(
        "!document.getElementById('action-result').hidden && document.getElementById('action-result').textContent",
        what=what,
    ))  # fmt: skip


def test_rollback_asks_for_the_token_and_shows_the_services_refusal(live: Live, browser: Browser) -> None:
    _open(browser, live.url)
    browser.evaluate("sessionStorage.clear()")
    browser.click("#rollback-button")
    browser.wait_for("document.getElementById('token-dialog').open", what="the token dialog")
    browser.click("#token-input")
    browser.type_text("wrong-token")
    browser.click("#token-submit")
    error = browser.wait_for(
        "!document.getElementById('token-error').hidden && document.getElementById('token-error').textContent",
        what="the refused-token message",
    )
    assert "refused the token (401)" in error
    assert browser.evaluate("sessionStorage.getItem('infersight.token')") is None
    browser.evaluate("document.getElementById('token-input').value = ''")
    browser.click("#token-input")
    browser.type_text(TOKEN)
    browser.click("#token-submit")
    toast = _toast(browser, "the rollback outcome")
    # no embedded runtime in this service: the real endpoint refuses with 409 and says why
    assert "Failed to roll back (409)" in toast and "no embedded runtime" in toast and "{" not in toast
    assert browser.evaluate("sessionStorage.getItem('infersight.token')") == TOKEN
    assert not browser.page_errors()


def test_snapshot_uses_the_remembered_token_and_is_stored(live: Live, browser: Browser) -> None:
    _open(browser, live.url)
    browser.evaluate(f"sessionStorage.setItem('infersight.token', '{TOKEN}')")
    browser.click("#snapshot-button")
    browser.wait_for("document.getElementById('token-dialog').open", what="the confirmation dialog")
    assert browser.evaluate("document.getElementById('token-input').value") == TOKEN
    browser.click("#token-submit")
    toast = _toast(browser, "the snapshot outcome")
    assert "Done: take a snapshot" in toast, toast
    stored = httpx.get(
        live.url + "api/v1/snapshots", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ).json()["snapshots"]
    assert stored and stored[0]["reason"] == "taken from the web page" and stored[0]["trigger"] == "manual"
    assert stored[0]["snapshot_id"] in toast
    assert not browser.page_errors()


def test_page_fits_a_phone_screen(live: Live, browser: Browser, tmp_path: Path) -> None:
    _open(browser, live.url, width=390, height=844)
    browser.wait_for("!!document.querySelector('#chart-latency path.series')", what="a latency line")
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    browser.screenshot(tmp_path / "web_page_phone.png")


def test_page_loads_nothing_from_outside_the_service(live: Live, browser: Browser) -> None:
    _open(browser, live.url)
    resources = browser.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert any(r.endswith("app.js") for r in resources)
    assert all(r.startswith(live.url) for r in resources), resources
    for asset in web_assets_dir().iterdir():
        text = asset.read_text().replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in text and "https://" not in text and "@import" not in text, asset.name
