"""A successful rollback, as the page shows it, in real headless Chromium.

The real service rolls back only with an embedded runtime, which is too heavy to start
here, so this one flow is served by a small ASGI app written here: the page's real assets
and the JSON contract of docs/dashboards.md for the overview, the timeseries and
`POST /api/v1/models/rollback`. Everything else the page does is tested against the real
service in test_web_page.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from infersight.dashboards import web_assets_dir
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tests._web_page_browser import Browser, serve
from tests.conftest import free_port, require_executable

TOKEN = "rollback-token-0123456789"
OLD, NEW = "mixtral_banking_int8-v1.1", "mixtral_banking_int8-v1.2"


@dataclass
class Runtime:
    """What the page sees of a runtime that can roll back: the serving version and the deploy log."""

    serving: str = NEW
    deploys: list[dict[str, object]] = field(default_factory=list)
    calls: list[str | None] = field(default_factory=list)

    async def overview(self, request: Request) -> JSONResponse:
        return JSONResponse({
            "model": "mixtral-demo", "serving_version": self.serving, "health": "ok", "uptime_s": 61.0,
            "firing_alerts": [], "drift": None, "deploys": self.deploys,
        })  # fmt: skip

    async def timeseries(self, request: Request) -> JSONResponse:
        t = [time.time() - 5 * i for i in range(5, 0, -1)]
        return JSONResponse({"t": t, "series": {"latency_p99_s": [0.2] * 5, "requests_per_s": [3.0] * 5}})

    async def rollback(self, request: Request) -> JSONResponse:
        self.calls.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse(
                {"error": {"type": "unauthorized", "message": "bad token", "field": None}}, 401
            )
        self.deploys.insert(0, {"at": time.time(), "from_version": self.serving, "to_version": OLD,
                                "reason": "rollback", "outcome": "rolled_back", "detail": "by hand"})  # fmt: skip
        self.serving = OLD
        return JSONResponse(
            {"outcome": "rolled_back", "from_version": NEW, "to_version": OLD, "warmup_s": 0.4}
        )

    def asgi(self) -> Starlette:
        return Starlette(routes=[
            Route("/api/v1/overview", self.overview),
            Route("/api/v1/timeseries", self.timeseries),
            Route("/api/v1/models/rollback", self.rollback, methods=["POST"]),
            Mount("/", StaticFiles(directory=web_assets_dir(), html=True)),
        ])  # fmt: skip


@pytest.fixture
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    b = Browser(require_executable("chromium"), tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


def test_successful_rollback_shows_the_outcome_and_the_new_serving_version(browser: Browser) -> None:
    runtime = Runtime()
    with serve(runtime.asgi(), free_port()) as url:
        browser.navigate(url + "?refresh=30")
        browser.wait_for(
            f"document.getElementById('serving-version').textContent === '{NEW}'", what="the page"
        )
        browser.evaluate("sessionStorage.clear()")
        browser.click("#rollback-button")
        browser.wait_for("document.getElementById('token-dialog').open", what="the token dialog")
        assert NEW in browser.evaluate("document.getElementById('token-explain').textContent")
        browser.click("#token-input")
        browser.type_text(TOKEN)
        browser.click("#token-submit")
        toast = browser.wait_for(
            "!document.getElementById('action-result').hidden && document.getElementById('action-result').textContent",
            what="the rollback outcome",
        )
        assert (
            "Done: roll back" in toast and "outcome: rolled_back" in toast and f"to version: {OLD}" in toast
        )
        # the page refreshes at once after an action: the new serving version and the deploy row
        browser.wait_for(
            f"document.getElementById('serving-version').textContent === '{OLD}'", what="the refresh"
        )
        row = browser.evaluate("document.querySelector('#deploys tbody tr').textContent")
        assert "rolled_back" in row and "by hand" in row
        assert runtime.calls == [f"Bearer {TOKEN}"]
        assert not browser.page_errors()
