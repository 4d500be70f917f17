"""What the service keeps stays private: the data directory and the SQLite files are
readable by their owner only, credentials and query strings never reach a log line or an
error message, the dataset export's temp file cannot be redirected or left open, and
checkpoint paths are shown only with the token."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _service_support import auth, config, event, running
from infersight.monitor.service import EngineConfig


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The common default umask (0022), under which files are world-readable unless the
    code asks otherwise."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_data_directory_is_0700_and_the_database_files_0600(tmp_path: Path, open_umask: None) -> None:
    cfg = config(tmp_path)
    with running(cfg) as (app, client):
        client.post("/api/v1/events", json={"events": [event(i, prompt="secret") for i in range(5)]},
                    headers=auth())  # fmt: skip
        app.state.service.writer.flush()
        data = Path(cfg.data_dir)
        files = {p.name: _mode(p) for p in data.iterdir() if p.name.startswith("infersight.sqlite")}
        assert _mode(data) == 0o700
        assert {"infersight.sqlite", "infersight.sqlite-wal", "infersight.sqlite-shm"} <= set(files), files
        assert set(files.values()) == {0o600}, files


def test_database_files_left_world_readable_are_narrowed_on_start(tmp_path: Path, open_umask: None) -> None:
    cfg = config(tmp_path)
    with running(cfg):
        pass
    db = Path(cfg.data_dir) / "infersight.sqlite"
    db.chmod(0o644)
    with running(cfg):
        assert _mode(db) == 0o600


def test_checkpoint_paths_are_listed_only_with_the_token(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp = tmp_path_factory.mktemp("paths")
    registry = private_copy(shared_demo_registry(tmp_path_factory), tmp / "registry")
    cfg = config(tmp, engine=EngineConfig(registry=registry, version=GOOD, max_batch_size=2, max_seq_len=128,
                                          max_prompt_tokens=64, max_tokens_limit=8))  # fmt: skip
    with running(cfg) as (_app, client):
        full = client.get("/api/v1/models", headers=auth()).json()
        paths = {v["name"]: v["path"] for v in full["versions"]}
        assert Path(paths[GOOD]).is_absolute() and Path(paths[GOOD]).exists()
        open_list = client.get("/api/v1/models")
        assert open_list.status_code == 200 and open_list.json()["serving_version"] == GOOD
        assert all("path" not in v for v in open_list.json()["versions"])
        assert not any(p in open_list.text for p in paths.values()) and "/tmp/" not in open_list.text
