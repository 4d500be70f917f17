"""The CLI's commands for a running server, against the service under uvicorn with the demo
model: `infersight models rollback`, `failover`, `replicas`, `mark-deploy` and
`analyses`, and what a 401 says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from _service_support import TOKEN, auth, config
from _web_page_browser import serve
from conftest import free_port
from infersight.monitor.cli import main
from infersight.monitor.service import EngineConfig, create_app


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    tmp = tmp_path_factory.mktemp("cli-server")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    port = free_port()
    cfg = config(tmp, port=port, engine=EngineConfig(registry=registry, version=GOOD, backup_version=BAD,
                                                     max_batch_size=2, max_seq_len=256, max_prompt_tokens=128))  # fmt: skip
    app = create_app(cfg)
    with serve(app, port) as url:
        yield app, url.rstrip("/")


@pytest.fixture
def no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERSIGHT_TOKEN", raising=False)


def test_failover_then_rollback_from_the_cli(
    served, capsys: pytest.CaptureFixture[str], no_env_token: None
) -> None:  # type: ignore[no-untyped-def]
    app, url = served
    token = ["--url", url, "--token", TOKEN]
    assert main(["models", "failover", *token]) == 0  # to engine.backup_version
    assert capsys.readouterr().out.strip() == f"failed over from {GOOD} to {BAD}"
    assert app.state.service.parts.backend.runtime.serving_version == BAD
    assert main(["models", "rollback", *token]) == 0
    assert capsys.readouterr().out.strip() == f"rolled back from {BAD} to {GOOD}"
    assert main(["models", "failover", "mixtral_banking_fp32-v9.9", *token]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "HTTP 404: body.version" in err
    assert app.state.service.parts.backend.runtime.serving_version == GOOD
    reasons = [d["reason"] for d in httpx.get(f"{url}/api/v1/models", timeout=30).json()["deploys"][:2]]
    assert reasons == ["rollback", "failover"]


def test_a_401_says_where_the_token_comes_from(
    served,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_env_token: None,  # type: ignore[no-untyped-def]
) -> None:
    _, url = served
    for verb in ("rollback", "failover", "replicas"):
        assert main(["models", verb, "--url", url, "--data-dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "HTTP 401" in err, err
        assert "--token" in err and "$INFERSIGHT_TOKEN" in err and "api-token" in err
    (tmp_path / "api-token").write_text(TOKEN + "\n")  # what `infersight serve` keeps in its data dir
    assert main(["models", "replicas", "--url", url, "--data-dir", str(tmp_path)]) == 0
    assert "NAME" in capsys.readouterr().out


def test_replicas_are_listed_with_version_leader_and_heartbeat(
    served, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    app, url = served
    app.state.service.parts.replicas.publish()
    assert httpx.get(f"{url}/api/v1/replicas", timeout=30).status_code == 401
    (me,) = httpx.get(f"{url}/api/v1/replicas", headers=auth(), timeout=30).json()["replicas"]
    assert me["this"] and me["live"] and me["leader"] and me["serving_version"] == GOOD
    assert me["name"] == app.state.service.replica_id and me["age_s"] < 60
    assert main(["models", "replicas", "--url", url, "--token", TOKEN]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert header.split() == ["NAME", "HOST", "VERSION", "LEADER", "LAST", "HEARTBEAT"]
    assert row.split()[:4] == [me["name"], me["host"], GOOD, "yes"]


def test_a_release_marked_from_the_cli_starts_an_analysis_that_the_cli_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_env_token: None
) -> None:
    """The SDK alone (no engine, no upstream): the pipeline that released the model says so."""
    port = free_port()
    with serve(create_app(config(tmp_path, port=port)), port) as url:
        token = ["--url", url.rstrip("/"), "--token", TOKEN]
        assert main(["models", "mark-deploy", "llama-3-8b-v2", "--previous", "llama-3-8b-v1", *token]) == 0
        out = capsys.readouterr().out.strip()
        assert out.startswith("post-deploy analysis 1: llama-3-8b-v2 against llama-3-8b-v1 from "), out
        assert "paired checks off" in out
        assert main(["models", "analyses", *token]) == 0
        (line,) = capsys.readouterr().out.strip().splitlines()
        assert line.startswith("1  llama-3-8b-v2 (after llama-3-8b-v1)  running  "), line
        assert main(["models", "mark-deploy", "llama-3-8b-v3", "--at", "tomorrow", *token]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "HTTP 422" in err and "at" in err, err
        assert main(["models", "analyses", *token]) == 0
        assert len(capsys.readouterr().out.strip().splitlines()) == 1  # the bad mark started nothing
