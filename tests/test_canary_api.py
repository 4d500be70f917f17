"""Canaries through the HTTP API and the CLI with the demo model: sticky users on each
version, every record carrying its version, and bad input refused naming the field."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from _service_support import auth, config
from fastapi.testclient import TestClient
from infersight.engine.runtime_canary import user_bucket
from infersight.monitor.cli import main
from infersight.monitor.service import EngineConfig, create_app
from infersight.monitor.store.tables import deploys, requests
from sqlalchemy import select


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, TestClient]]:
    tmp = tmp_path_factory.mktemp("canary")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = config(tmp, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=4, max_seq_len=512,
                                          max_prompt_tokens=256, max_tokens_limit=16,
                                          canary_user_header="X-User"))  # fmt: skip
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield app, client


def _field(r: object) -> str | None:
    return r.json()["error"]["field"]  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("weight", [0, -0.5, 1.01, "a lot"])
def test_weight_outside_zero_one_is_a_422_naming_body_weight(served, weight) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    r = client.post("/api/v1/models/canary", json={"version": BAD, "weight": weight}, headers=auth())
    assert r.status_code == 422 and _field(r) == "body.weight"
    assert client.get("/api/v1/models/canary").json()["version"] is None


def test_unknown_version_and_missing_token_are_refused(served) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    unknown = {"version": "mixtral_banking_fp32-v9.9", "weight": 0.1}
    r = client.post("/api/v1/models/canary", json=unknown, headers=auth())
    assert r.status_code == 404 and _field(r) == "body.version"
    assert client.post("/api/v1/models/canary", json={"version": BAD, "weight": 0.1}).status_code == 401
    r = client.post("/api/v1/models/canary/abort", headers=auth())
    assert r.status_code == 409 and "no canary" in r.json()["error"]["message"]


def test_canary_serves_sticky_users_records_their_version_and_refuses_a_second(served) -> None:  # type: ignore[no-untyped-def]
    app, client = served
    r = client.post("/api/v1/models/canary", json={"version": BAD, "weight": 0.5}, headers=auth())
    assert r.status_code == 200, r.text
    assert (r.json()["version"], r.json()["stable_version"], r.json()["weight"]) == (BAD, GOOD, 0.5)
    second = client.post("/api/v1/models/canary", json={"version": BAD, "weight": 0.2}, headers=auth())
    assert second.status_code == 409 and _field(second) == "body.version" and BAD in second.text
    deploy = client.post("/api/v1/models/deploy", json={"version": BAD}, headers=auth())
    assert deploy.status_code == 409 and "canary" in deploy.text
    users = [f"customer-{i}" for i in range(12)]
    ids: dict[str, str] = {}
    for user in users * 2:  # each user twice: the same version both times
        body = {"prompt": "how do i top up my card", "max_tokens": 2, "user": user}
        r = client.post("/v1/completions", json=body, headers=auth())  # the token: told the version
        expected = BAD if user_bucket(user, BAD) < 0.5 else GOOD
        assert r.headers["x-infersight-version"] == expected and r.json()["model"] == "mixtral_banking"
        ids[r.json()["id"]] = expected
    assert set(ids.values()) == {GOOD, BAD}
    # the configured header wins over the body's user field
    header_user = next(u for u in (f"h{i}" for i in range(100)) if user_bucket(u, BAD) < 0.5)
    body_user = next(u for u in (f"b{i}" for i in range(100)) if user_bucket(u, BAD) >= 0.5)
    r = client.post("/v1/completions", json={"prompt": "card", "max_tokens": 2, "user": body_user},
                    headers={"X-User": header_user, **auth()})  # fmt: skip
    assert r.headers["x-infersight-version"] == BAD
    service = app.state.service  # type: ignore[attr-defined]
    assert service.writer.flush()
    with service.db.connect() as conn:
        rows = dict(conn.execute(select(requests.c.request_id, requests.c.model_version)).all())
    assert all(rows[rid] == version for rid, version in ids.items())
    status = client.get("/api/v1/models/canary").json()
    assert status["canary_requests"] >= 12 and status["stable_requests"] >= 12
    r = client.post("/api/v1/models/canary/abort", headers=auth())
    assert r.status_code == 200 and r.json()["version"] is None
    r = client.post("/v1/completions", json={"prompt": "card", "max_tokens": 2, "user": header_user},
                    headers=auth())  # fmt: skip
    assert r.headers["x-infersight-version"] == GOOD
    # the abort reaches the deploy log through the runtime's events (its loop thread)
    assert _logged(service, lambda outcomes: outcomes == ["started", "rolled_back"])


def test_cli_refuses_a_bad_weight_and_an_unreachable_server_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["models", "canary", BAD, "--weight", "1.5"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--weight must lie in (0, 1]" in err and "\n" not in err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    assert main(["models", "canary", BAD, "--weight", "0.1", "--url", f"http://127.0.0.1:{port}"]) != 0
    err = capsys.readouterr().err.strip()
    assert "cannot reach" in err and "\n" not in err


def test_cli_starts_and_reports_a_canary_on_a_running_server(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    tmp = tmp_path_factory.mktemp("canary-cli")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = config(tmp, port=port, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=2,
                                                     max_seq_len=256, max_prompt_tokens=128))  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        import time

        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        url, token = f"http://127.0.0.1:{port}", ["--token", cfg.token or ""]
        assert main(["models", "canary", BAD, "--weight", "0.1", "--url", url, *token]) == 0
        assert f"canary {BAD} at 10% of users beside {GOOD}" in capsys.readouterr().out
        assert main(["models", "canary", BAD, "--weight", "0.2", "--url", url, *token]) != 0
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "HTTP 409: body.version:" in err and "is running" in err
        assert main(["models", "canary", "--abort", "--url", url, *token]) == 0
        assert "no canary running" in capsys.readouterr().out
    finally:
        server.should_exit = True
        thread.join(30)


def _logged(service: Any, want: Callable[[list[str]], bool]) -> bool:
    """The canary rows of `deploys` satisfy `want` once the runtime's events (delivered by
    its loop thread) reached the deploy log; flushed here rather than waiting for its tick."""
    for _ in range(100):
        service.parts.deploy_log.flush()
        with service.db.connect() as conn:
            query = select(deploys.c.outcome).where(deploys.c.reason == "canary").order_by(deploys.c.id)
            if want(list(conn.execute(query).scalars())):
                return True
        time.sleep(0.1)
    return False


def _canary_app(tmp: object, registry: object, database_url: str | None = None) -> object:
    cfg = config(tmp, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=2, max_seq_len=256,  # type: ignore[arg-type]
                                          max_prompt_tokens=128, max_tokens_limit=8),
                 database_url=database_url)  # fmt: skip
    return create_app(cfg)


def test_a_restarted_service_resumes_the_canary_with_its_stored_evidence(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("canary-restart")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    app = _canary_app(tmp, registry)
    with TestClient(app, raise_server_exceptions=False) as client:  # type: ignore[arg-type]
        r = client.post("/api/v1/models/canary", json={"version": BAD, "weight": 0.5}, headers=auth())
        assert r.status_code == 200, r.text
        for i in range(10):
            body = {"prompt": "how do i top up my card", "max_tokens": 2, "user": f"c{i}"}
            assert client.post("/v1/completions", json=body).status_code == 200
        before = client.get("/api/v1/models/canary").json()
        assert app.state.service.writer.flush()  # type: ignore[attr-defined]
    again = _canary_app(tmp, registry)  # the same registry and store: a restart
    with TestClient(again, raise_server_exceptions=False) as client:  # type: ignore[arg-type]
        now = client.get("/api/v1/models/canary").json()
        assert (now["version"], now["stable_version"], now["weight"]) == (BAD, GOOD, 0.5)
        # the analysis goes on with what the store recorded, not from zero
        assert (now["canary_requests"], now["stable_requests"]) == (
            before["canary_requests"],
            before["stable_requests"],
        )
        assert now["canary_requests"] + now["stable_requests"] == 10
        service = again.state.service  # type: ignore[attr-defined]
        assert _logged(service, lambda outcomes: outcomes == ["started", "resumed"])
        assert client.post("/api/v1/models/canary/abort", headers=auth()).status_code == 200


def test_a_second_replica_on_the_same_postgresql_refuses_another_canary(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str
) -> None:
    shared = shared_demo_registry(tmp_path_factory)
    a_dir, b_dir = tmp_path_factory.mktemp("replica-a"), tmp_path_factory.mktemp("replica-b")
    a = _canary_app(a_dir, private_copy(shared, a_dir / "registry"), postgres_url)
    b = _canary_app(b_dir, private_copy(shared, b_dir / "registry"), postgres_url)
    with (
        TestClient(a, raise_server_exceptions=False) as ca,
        TestClient(b, raise_server_exceptions=False) as cb,
    ):  # type: ignore[arg-type]
        r = ca.post("/api/v1/models/canary", json={"version": BAD, "weight": 0.1}, headers=auth())
        assert r.status_code == 200, r.text
        # B learns of A's canary from A's rows in `deploys`, written once A's loop thread delivered the start
        assert _logged(a.state.service, lambda outcomes: outcomes[-1:] == ["started"])  # type: ignore[attr-defined]
        b.state.service.parts.replicas.publish()  # type: ignore[attr-defined]
        a.state.service.parts.replicas.publish()  # type: ignore[attr-defined]
        r = cb.post("/api/v1/models/canary", json={"version": BAD, "weight": 0.2}, headers=auth())
        a_id = a.state.service.replica_id  # type: ignore[attr-defined]
        assert r.status_code == 409 and _field(r) == "body.version" and a_id in r.json()["error"]["message"]
        assert cb.get("/api/v1/models/canary").json()["version"] is None  # B serves its stable version only
        assert ca.post("/api/v1/models/canary/abort", headers=auth()).status_code == 200
        assert _logged(a.state.service, lambda outcomes: outcomes[-1:] == ["rolled_back"])  # type: ignore[attr-defined]
        r = cb.post("/api/v1/models/canary", json={"version": BAD, "weight": 0.2}, headers=auth())
        assert r.status_code == 200, r.text  # A's canary ended: B may run one
        assert cb.post("/api/v1/models/canary/abort", headers=auth()).status_code == 200


def test_a_release_mark_is_refused_where_the_embedded_runtime_reports_its_own_deploys(served) -> None:  # type: ignore[no-untyped-def]
    _, client = served
    history = client.get("/api/v1/models").json()["deploys"]
    r = client.post("/api/v1/deploys", json={"version": GOOD}, headers=auth())
    assert r.status_code == 409 and "POST /api/v1/models/deploy" in r.text, r.text
    assert client.get("/api/v1/models").json()["deploys"] == history  # nothing recorded
