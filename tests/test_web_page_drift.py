"""The drift explanation click-through and successful rollback and snapshot, in real headless Chromium.

The service's drift router and an embedded runtime that can roll back are not in the app
yet, so these two flows are served by a small ASGI app written here: the page's real assets
plus the JSON contract of docs/architecture.md, computed from InferenceRecords and the
bundled hotel utterances (one new point per poll). Everything else the page shows is
tested against the real service in test_web_page.py.
"""

from __future__ import annotations

import datetime as dt
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from infersight.dashboards import web_assets_dir
from infersight.monitor.data import banking77, hotels
from infersight.monitor.records import InferenceRecord
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tests._web_page_browser import Browser, serve
from tests.conftest import free_port, require_executable

TOKEN = "s3cret-token"
XSS = '<img src=x onerror="window.__xss = 1">'


def _drift_report(hotel: list[str], bank: list[str]) -> Any:
    """A DriftReport built from the drift module's own result dataclasses (their `to_json()` is
    the shape the page reads), with real hotel utterances as what appeared."""
    from infersight.monitor.drift import (
        ClusterShare,
        DriftReport,
        ExampleText,
        FieldExplanation,
        FieldVerdict,
        Novelty,
        NoveltyExample,
        Projection,
        RelevanceComparison,
        ReportContext,
        TestResult,
        summarize_relevance,
    )

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


class ContractApp:
    """The web page's JSON endpoints, from real records; every timeseries poll adds one tick."""

    def __init__(self) -> None:
        self.rng = random.Random(7)
        self.t0 = time.time() - 300
        self.ticks: list[tuple[float, dict[str, float | None]]] = []
        self.actions: list[tuple[str, str | None]] = []
        hotel = [u.text for u in hotels()]
        bank = [u.text for u in banking77()]
        self.hotel_witness = hotel[:5]
        self.hotel_novel = hotel[20:24]
        self.report = {"id": 7, **_drift_report(hotel, bank).to_json()}
        for _ in range(40):
            self._tick()

    def _tick(self) -> None:
        t = self.t0 + 5 * len(self.ticks)
        records = [
            InferenceRecord(
                request_id=f"r{len(self.ticks)}-{i}",
                model="mixtral-demo",
                model_version="v1.2",
                started_at=t,
                duration_s=self.rng.lognormvariate(-2.0, 0.5),
                ttft_s=self.rng.lognormvariate(-3.5, 0.3),
            )
            for i in range(50)
        ]
        q = statistics.quantiles([r.duration_s for r in records], n=100)
        ttft = statistics.quantiles([r.ttft_s or 0.0 for r in records], n=100)
        self.ticks.append(
            (
                t,
                {
                    "latency_p50_s": q[49],
                    "latency_p95_s": q[94],
                    "latency_p99_s": q[98],
                    "ttft_p95_s": ttft[94],
                    "requests_per_s": len(records) / 5,
                    "gpu_sm_activity_ratio": None,
                    "gpu_memory_used_bytes": None,
                    "process_rss_bytes": 2.1e9 + len(self.ticks) * 4e6,
                },
            )
        )

    async def timeseries(self, request: Request) -> JSONResponse:
        self._tick()
        names = list(self.ticks[0][1])
        return JSONResponse(
            {"t": [t for t, _ in self.ticks], "series": {n: [p[n] for _, p in self.ticks] for n in names}}
        )

    async def overview(self, request: Request) -> JSONResponse:
        drop = {"explanation", "tests", "relevance", "embedder", "seed"}
        summary = {k: v for k, v in self.report.items() if k not in drop}
        return JSONResponse(
            {
                "model": "mixtral-demo",
                "serving_version": "mixtral_banking_int8-v1.2",
                "health": "degraded",
                "uptime_s": 3725.0,
                "firing_alerts": [
                    {
                        "alertname": "LatencyP99High",
                        "severity": "critical",
                        "summary": "p99 latency 1.9 s over the 1.5 s SLA",
                        "active_since": time.time() - 240,
                        "labels": {"model_version": "v1.2"},
                    }
                ],
                "drift": summary,
                "deploys": [
                    {
                        "at": time.time() - 900,
                        "from_version": "mixtral_banking_int8-v1.1",
                        "to_version": "mixtral_banking_int8-v1.2",
                        "reason": "release",
                        "outcome": "deployed",
                    },
                    {
                        "at": time.time() - 7200,
                        "from_version": None,
                        "to_version": "mixtral_banking_int8-v1.1",
                        "reason": "initial",
                        "outcome": "deployed",
                    },
                ],
            }
        )

    async def drift_report(self, request: Request) -> JSONResponse:
        if request.path_params["report_id"] != "7":
            return JSONResponse(
                {"error": {"type": "not_found", "message": "no such report", "field": "report_id"}}, 404
            )
        return JSONResponse(self.report)

    async def rollback(self, request: Request) -> JSONResponse:
        auth = request.headers.get("authorization")
        self.actions.append(("rollback", auth))
        if auth != f"Bearer {TOKEN}":
            return JSONResponse(
                {"error": {"type": "unauthorized", "message": "bad token", "field": None}}, 401
            )
        return JSONResponse(
            {
                "outcome": "rolled_back",
                "from_version": "mixtral_banking_int8-v1.2",
                "to_version": "mixtral_banking_int8-v1.1",
            }
        )

    async def snapshot(self, request: Request) -> JSONResponse:
        auth = request.headers.get("authorization")
        self.actions.append(("snapshot", auth))
        if auth != f"Bearer {TOKEN}":
            return JSONResponse(
                {"error": {"type": "unauthorized", "message": "bad token", "field": None}}, 401
            )
        return JSONResponse(
            {"snapshot_id": "snap-20261129-0001", "request_count": 200, "path": "/var/snap-1.json"}
        )

    def asgi(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/api/v1/overview", self.overview),
                Route("/api/v1/timeseries", self.timeseries),
                Route("/api/v1/drift/{report_id}", self.drift_report),
                Route("/api/v1/models/rollback", self.rollback, methods=["POST"]),
                Route("/api/v1/snapshots", self.snapshot, methods=["POST"]),
                Mount("/", StaticFiles(directory=web_assets_dir(), html=True)),
            ]
        )


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, ContractApp]]:
    contract = ContractApp()
    with serve(contract.asgi(), free_port()) as url:
        yield url, contract


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    executable = require_executable("chromium")
    b = Browser(executable, tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


def _points(b: Browser, chart: str, series: str) -> int:
    return int(
        b.evaluate(
            f"Number(document.querySelector('#{chart} path.series[data-series=\"{series}\"]')?.dataset.points || 0)"
        )
    )


def test_drift_verdict_clicks_through_to_its_explanation(
    served: tuple[str, ContractApp], browser: Browser, tmp_path: Path
) -> None:
    url, contract = served
    browser.navigate(url + "?refresh=1")
    browser.wait_for("Number(document.body.dataset.updates || 0) >= 1", what="first data load")

    # charts: one SVG path per series, with a point per tick of live data
    first = _points(browser, "chart-latency", "p99")
    assert first >= 40
    d = browser.evaluate(
        "document.querySelector('#chart-latency path.series[data-series=\"p99\"]').getAttribute('d')"
    )
    assert d.startswith("M") and d.count("L") == first - 1
    for chart, series in [
        ("chart-latency", "p50"),
        ("chart-latency", "TTFT p95"),
        ("chart-rps", "requests/s"),
        ("chart-rss", "RSS"),
    ]:
        assert _points(browser, chart, series) >= 40, (chart, series)
    browser.wait_for(
        f"Number(document.querySelector('#chart-latency path.series[data-series=\"p99\"]').dataset.points) > {first}",
        what="a new point from the next poll",
    )

    # header, alerts, deploys, no-GPU notice
    assert (
        browser.evaluate("document.getElementById('serving-version').textContent")
        == "mixtral_banking_int8-v1.2"
    )
    assert browser.evaluate("document.getElementById('health').textContent") == "degraded"
    assert "LatencyP99High" in browser.evaluate("document.getElementById('alerts').textContent")
    assert browser.evaluate("document.querySelectorAll('#deploys tbody tr').length") == 2
    assert browser.visible("#no-gpu") and not browser.visible("#chart-gpu-sm")
    assert "Drift detected" in browser.evaluate("document.getElementById('drift-summary').textContent")
    assert not browser.visible("#drift-detail")

    # click through to the explanation: hotel utterances appear, as text
    browser.click("#drift-open")
    body = browser.wait_for(
        "!document.getElementById('drift-detail').hidden && document.getElementById('drift-detail').dataset.reportId"
        " && document.getElementById('drift-body').textContent",
        what="the drift explanation",
    )
    for text in contract.hotel_witness:
        assert text in body
    assert "Clusters of the reference" in body and "20%" in body  # the new cluster's current share
    assert "Novelty" in body and "nearest reference" in body
    assert "Prompt–response relevance" in body  # the relevance comparison's table
    for text in contract.hotel_novel:
        assert text in body
    scatter = browser.wait_for(
        "document.querySelector('#drift-body .scatter-svg')?.getAttribute('aria-label')",
        what="the projection scatter",
    )
    assert "60 reference texts, 60 current texts of which 12 novel" in scatter
    assert browser.evaluate("document.querySelectorAll('#drift-body .pts-novel circle').length") == 12
    assert XSS in body and browser.evaluate("window.__xss === undefined")  # shown as text, never as markup
    assert (
        browser.visible("#drift-detail")
        and browser.evaluate("document.activeElement.id") == "drift-detail-title"
    )

    png = browser.screenshot(tmp_path / "web_page.png")
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert not browser.page_errors()


def test_rollback_and_snapshot_ask_for_the_token_and_show_the_outcome(
    served: tuple[str, ContractApp], browser: Browser
) -> None:
    url, contract = served
    browser.navigate(url + "?refresh=30")
    browser.wait_for("Number(document.body.dataset.updates || 0) >= 1", what="first data load")
    browser.evaluate("sessionStorage.clear()")
    browser.click("#rollback-button")
    browser.wait_for("document.getElementById('token-dialog').open", what="the token dialog")
    browser.click("#token-input")
    browser.type_text("wrong")
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
    toast = browser.wait_for(
        "!document.getElementById('action-result').hidden && document.getElementById('action-result').textContent",
        what="the rollback result",
    )
    assert "Done: roll back" in toast and "rolled_back" in toast and "mixtral_banking_int8-v1.1" in toast
    assert contract.actions[-2:] == [("rollback", "Bearer wrong"), ("rollback", f"Bearer {TOKEN}")]
    assert browser.evaluate("sessionStorage.getItem('infersight.token')") == TOKEN
    assert not browser.page_errors()

    # the token is remembered for this tab: a snapshot only needs a confirmation
    browser.click("#action-result .btn")  # dismiss
    browser.click("#snapshot-button")
    browser.wait_for("document.getElementById('token-dialog').open", what="the confirmation dialog")
    assert browser.evaluate("document.getElementById('token-input').value") == TOKEN
    browser.click("#token-submit")
    toast = browser.wait_for(
        "!document.getElementById('action-result').hidden && document.getElementById('action-result').textContent",
        what="the snapshot result",
    )
    assert "Done: take a snapshot" in toast and "snap-20261129-0001" in toast
    assert contract.actions[-1] == ("snapshot", f"Bearer {TOKEN}")
    assert not browser.page_errors()
