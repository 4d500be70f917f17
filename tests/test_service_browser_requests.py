"""A web page in the operator's browser cannot drive a sidecar on localhost: a cross-site
"simple" POST (text/plain, a form) to the API is 415, and a request naming a host the service
does not listen on (DNS rebinding) is 421, both before any route runs and storing nothing.
Served by uvicorn on a loopback port, as `infersight serve` does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _service_support import auth, config, event
from _web_page_browser import serve
from conftest import free_port
from infersight.monitor.service import ConfigInvalid, create_app, load_config
from infersight.monitor.store.tables import requests
from sqlalchemy import func, select


def _stored(app: Any) -> int:
    app.state.service.writer.flush()
    with app.state.service.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(requests)).scalar_one())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, httpx.Client, int]]:
    port = free_port()
    app = create_app(
        config(tmp_path_factory.mktemp("guard"), port=port, allowed_hosts=("infersight.internal",))
    )
    with serve(app, port) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield app, client, port


BODY = b'{"events": [{"request_id": "x"}]}'


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/api/v1/events"])
def test_a_body_that_is_not_json_is_415_naming_the_header(
    served, path: str, content_type: str | None
) -> None:  # type: ignore[no-untyped-def]
    app, client, _ = served
    before = _stored(app)
    headers = {**auth(), **({"content-type": content_type} if content_type else {})}
    r = client.post(path, content=b'{"prompt": "hi", "model": "m"}' if path.startswith("/v1") else BODY,
                    headers=headers)  # fmt: skip
    assert r.status_code == 415, r.text
    assert r.json()["error"]["field"] == "header.content-type"
    assert _stored(app) == before


def test_json_bodies_and_bodiless_requests_pass(served) -> None:  # type: ignore[no-untyped-def]
    _app, client, _ = served
    ok = client.post("/api/v1/events", json={"events": [event(1)]}, headers=auth())
    assert ok.status_code == 200 and ok.json()["accepted"] == 1
    charset = client.post("/api/v1/events", content=b'{"events": []}',
                          headers={**auth(), "content-type": "application/json; charset=utf-8"})  # fmt: skip
    assert charset.status_code != 415
    assert client.get("/healthz").status_code == 200 and client.get("/metrics").status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example", "10.0.0.1"]
)
def test_a_host_the_service_does_not_listen_on_is_421(served, host: str) -> None:  # type: ignore[no-untyped-def]
    app, client, port = served
    before = _stored(app)
    for method, path, body in (("GET", "/api/v1/overview", None), ("POST", "/api/v1/events", {"events": [event(2)]}),
                               ("GET", "/healthz", None)):  # fmt: skip
        r = client.request(method, path, json=body, headers={**auth(), "host": host.format(port=port)})
        assert r.status_code == 421, (method, path, r.text)
        assert r.json()["error"]["field"] == "header.host"
    assert _stored(app) == before


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "infersight.internal"]
)
def test_the_listen_address_loopback_names_and_allowed_hosts_are_answered(served, host: str) -> None:  # type: ignore[no-untyped-def]
    _, client, port = served
    assert client.get("/healthz", headers={"host": host.format(port=port)}).status_code == 200


def test_allowed_hosts_is_read_from_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "infersight.yaml"
    path.write_text("allowed_hosts: [infersight.internal, 'sidecar:8000']\n")
    assert load_config(path, {}).allowed_hosts == ("infersight.internal", "sidecar:8000")
    path.write_text("allowed_hosts: infersight.internal\n")
    with pytest.raises(ConfigInvalid, match="allowed_hosts: must be a list of strings"):
        load_config(path, {})
