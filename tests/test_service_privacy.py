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
from _service_support import auth, config, event, running


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
