"""`infersight dashboards push` against a local stand-in for Grafana's HTTP API.

Grafana's server is an external boundary we cannot run here, so a small HTTP server plays
it: it validates requests the way Grafana's /api/dashboards/db and /api/folders do
(bearer auth, JSON body with `dashboard`, `overwrite`, `folderUid`, version conflicts,
unknown folders) and records every request for the assertions.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from infersight.dashboards import push_dashboard
from infersight.dashboards._export import GrafanaRejected, GrafanaUnreachable, InvalidGrafanaURL
from infersight.monitor.cli import main

from tests.conftest import free_port

TOKEN = "glsa_test_token_123"


@dataclass
class GrafanaStandIn:
    url: str
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    folders: dict[str, str] = field(default_factory=lambda: {"ops-uid": "Ops"})  # uid -> title
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> {"version", "folderUid"}
    force_status: int | None = None


def _handler(state: GrafanaStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            return json.loads(raw) if raw else None

        def _route(self, method: str) -> None:
            body = self._body() if method == "POST" else None
            state.requests.append((method, self.path, dict(self.headers), body))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._answer(401, {"message": "invalid API key"})
            if state.force_status is not None:
                return self._answer(state.force_status, {"message": "forced by the test"})
            if method == "POST" and not self.headers.get("Content-Type", "").startswith("application/json"):
                return self._answer(415, {"message": "expected application/json"})
            if (method, self.path) == ("GET", "/api/folders"):
                return self._answer(
                    200, [{"uid": u, "title": t, "id": i} for i, (u, t) in enumerate(state.folders.items())]
                )
            if (method, self.path) == ("POST", "/api/folders"):
                return self._create_folder(body)
            if (method, self.path) == ("POST", "/api/dashboards/db"):
                return self._save_dashboard(body)
            return self._answer(404, {"message": "Not found"})

        def _create_folder(self, body: Any) -> None:
            title = body.get("title") if isinstance(body, dict) else None
            if not title:
                return self._answer(400, {"message": "folder title cannot be empty"})
            if title in state.folders.values():
                return self._answer(409, {"message": "a folder with the same name already exists"})
            uid = re.sub(r"\W", "-", title.lower()) + "-uid"
            state.folders[uid] = title
            return self._answer(200, {"uid": uid, "title": title, "id": len(state.folders)})

        def _save_dashboard(self, body: Any) -> None:
            if not isinstance(body, dict) or not isinstance(body.get("dashboard"), dict):
                return self._answer(400, {"message": "bad request data: dashboard is required"})
            dash = body["dashboard"]
            if not dash.get("title"):
                return self._answer(400, {"message": "Dashboard title cannot be empty"})
            if dash.get("id") not in (None, 0):
                return self._answer(404, {"message": "Dashboard not found"})
            folder_uid = body.get("folderUid")
            if folder_uid and folder_uid not in state.folders:
                return self._answer(400, {"message": "folder not found"})
            uid = dash.get("uid") or "generated"
            existing = state.dashboards.get(uid)
            if existing is not None and not body.get("overwrite"):
                return self._answer(
                    412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
                )
            version = existing["version"] + 1 if existing else 1
            state.dashboards[uid] = {"version": version, "folderUid": folder_uid, "dashboard": dash}
            slug = re.sub(r"[^a-z0-9]+", "-", dash["title"].lower()).strip("-")
            return self._answer(
                200,
                {
                    "id": 7,
                    "uid": uid,
                    "url": f"/d/{uid}/{slug}",
                    "status": "success",
                    "version": version,
                    "slug": slug,
                },
            )

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler


@pytest.fixture
def grafana() -> Iterator[GrafanaStandIn]:
    port = free_port()
    state = GrafanaStandIn(url=f"http://127.0.0.1:{port}")
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(state))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_push_posts_the_dashboard_to_grafana_stand_in_with_bearer_token(grafana: GrafanaStandIn) -> None:
    result = push_dashboard(grafana.url, TOKEN)
    (req,) = [r for r in grafana.requests if r[1] == "/api/dashboards/db"]
    method, _, headers, body = req
    assert method == "POST" and headers["Authorization"] == f"Bearer {TOKEN}"
    assert body["overwrite"] is True and "folderUid" not in body
    assert body["dashboard"]["uid"] == "infersight-overview" and body["dashboard"]["panels"]
    assert result.uid == "infersight-overview" and result.version == 1
    assert result.url == "/d/infersight-overview/infersight-llm-serving"


def test_push_twice_overwrites_and_bumps_the_version(grafana: GrafanaStandIn) -> None:
    push_dashboard(grafana.url, TOKEN)
    assert push_dashboard(grafana.url, TOKEN).version == 2


def test_push_into_a_folder_finds_it_by_title_or_creates_it(grafana: GrafanaStandIn) -> None:
    assert push_dashboard(grafana.url, TOKEN, folder="Ops").folder_uid == "ops-uid"
    created = push_dashboard(grafana.url, TOKEN, folder="LLM serving")
    assert created.folder_uid == "llm-serving-uid" and grafana.folders["llm-serving-uid"] == "LLM serving"
    posts = [r[3] for r in grafana.requests if r[1] == "/api/dashboards/db"]
    assert [p["folderUid"] for p in posts] == ["ops-uid", "llm-serving-uid"]
    assert grafana.dashboards["infersight-overview"]["folderUid"] == "llm-serving-uid"


def test_cli_push_prints_where_the_dashboard_is(
    grafana: GrafanaStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["dashboards", "push", "--url", grafana.url + "/", "--token", TOKEN, "--folder", "ops-uid"]) == 0
    )
    out = capsys.readouterr().out
    assert f"{grafana.url}/d/infersight-overview/" in out and "version 1" in out


def test_wrong_token_is_a_one_line_cli_error(
    grafana: GrafanaStandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboards", "push", "--url", grafana.url, "--token", "wrong"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Grafana answered 401" in err and "invalid API key" in err
    with pytest.raises(GrafanaRejected) as info:
        push_dashboard(grafana.url, "wrong")
    assert info.value.status == 401


@pytest.mark.parametrize("status", [403, 412, 500])
def test_grafana_error_status_is_reported_with_its_message(grafana: GrafanaStandIn, status: int) -> None:
    grafana.force_status = status
    with pytest.raises(GrafanaRejected, match=f"Grafana answered {status}: forced by the test") as info:
        push_dashboard(grafana.url, TOKEN)
    assert info.value.status == status


@pytest.mark.parametrize("url", ["ftp://grafana", "grafana:3000", "http://", "http://host:99999"])
def test_bad_url_is_refused_before_any_request(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidGrafanaURL):
        push_dashboard(url, TOKEN)
    assert main(["dashboards", "push", "--url", url, "--token", TOKEN]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "infersight dashboards: error:" in err


def test_closed_port_is_unreachable_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GrafanaUnreachable, match="Connection refused"):
        push_dashboard(url, TOKEN, timeout_s=2)
    assert main(["dashboards", "push", "--url", url, "--token", TOKEN, "--timeout", "2"]) == 2
    assert "cannot reach Grafana" in capsys.readouterr().err


def test_missing_token_is_a_one_line_cli_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert main(["dashboards", "push", "--url", "http://127.0.0.1:3000"]) == 2
    assert "token is required" in capsys.readouterr().err
