"""What the service keeps stays private: the data directory and the SQLite files are
readable by their owner only, credentials and query strings never reach a log line or an
error message, the dataset export's temp file cannot be redirected or left open, and
checkpoint paths are shown only with the token."""

from __future__ import annotations

import dataclasses
import http.server
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from _demo_registry import GOOD, private_copy, shared_demo_registry
from _service_support import auth, config, event, running
from conftest import free_port
from infersight.alerts import HttpxSender
from infersight.alerts.errors import DeliveryFailed
from infersight.alerts.notify.receivers import HttpRequest
from infersight.monitor.redaction import QUIET_LOGGERS, install_log_redaction, redact_text
from infersight.monitor.service import EngineConfig
from infersight.monitor.service.config import UpstreamConfig


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


# -- credentials and query strings out of logs and errors ------------------------------------------
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://user:pa55@hooks.example.com/services/x?key=k1#frag",
            "https://***@hooks.example.com/services/x?***",
        ),
        ("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
        ("postgresql://app:pw@db:5432/infersight", "postgresql://***@db:5432/infersight"),
        ("sent to 'https://h.example/a?token=t' twice", "sent to 'https://h.example/a?***' twice"),
    ],
)
def test_urls_lose_their_credentials_and_query_strings(url: str, shown: str) -> None:
    assert redact_text(url) == shown


@pytest.fixture
def log_redaction() -> Iterator[None]:
    """install_log_redaction as `infersight serve` calls it, undone afterwards."""
    factory = logging.getLogRecordFactory()
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    install_log_redaction()
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


class _Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://alice:pa55w0rd@127.0.0.1:{server.server_address[1]}/hook?key=SECRETKEY"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def test_a_webhook_delivery_logs_no_url_credentials_or_key(
    hook_url: str, log_redaction: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # the service's default level
    sender = HttpxSender()
    try:
        assert (
            sender.send(HttpRequest(hook_url, b"{}", (("content-type", "application/json"),))).status == 204
        )
        logging.getLogger("httpx").warning("retrying %s", hook_url)  # one that passes the level
        try:
            raise RuntimeError(f"cannot post to {hook_url}")
        except RuntimeError:
            logging.getLogger("infersight.test").exception("delivery failed")
    finally:
        sender.close()
    text = caplog.text + "".join(r.exc_text or "" for r in caplog.records)
    assert "retrying http://***@127.0.0.1" in text and "cannot post to http://***@127.0.0.1" in text
    assert "pa55w0rd" not in text and "SECRETKEY" not in text and "alice" not in text
    assert not [
        r for r in caplog.records if r.name.startswith(("httpx", "httpcore")) and r.levelno < logging.WARNING
    ]


def test_an_unreachable_webhook_fails_without_the_credentials_in_the_error() -> None:
    sender = HttpxSender()
    try:
        with pytest.raises(DeliveryFailed) as info:
            sender.send(
                HttpRequest(f"http://bob:hunter2@127.0.0.1:{free_port()}/h?key=K", b"{}", timeout_s=2)
            )
        bad = HttpRequest("http://bob:hunter2@127.0.0.1:99999/h?key=K", b"{}")
        with pytest.raises(DeliveryFailed) as port:
            sender.send(bad)
    finally:
        sender.close()
    for exc in (info.value, port.value):
        assert "hunter2" not in str(exc) and "key=K" not in str(exc), exc


def test_proxy_error_to_an_unauthenticated_client_hides_the_upstream_credentials(tmp_path: Path) -> None:
    upstream = f"http://svc:upstream-pass@127.0.0.1:{free_port()}/openai?api-key=UPKEY"
    with running(config(tmp_path, upstream=UpstreamConfig(url=upstream, timeout_s=5))) as (_app, client):
        for path, body in (("/v1/completions", {"model": "m", "prompt": "hi"}), ("/v1/models", None)):
            r = client.request("POST" if body else "GET", path, json=body)
            assert r.status_code in (502, 503, 504), (path, r.status_code, r.text)
            assert "upstream-pass" not in r.text and "UPKEY" not in r.text and "svc:" not in r.text, r.text
            assert "127.0.0.1" in r.text  # still says which upstream


def test_infersight_serve_installs_the_log_redaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_redaction: None
) -> None:
    import uvicorn
    from infersight.monitor.cli import main

    logging.setLogRecordFactory(logging.LogRecord)  # as a fresh process has it
    logging.getLogger("httpx").setLevel(logging.NOTSET)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)  # start and stop, serving nothing
    monkeypatch.setenv("INFERSIGHT_TOKEN", "a-token-for-this-test-0123")
    assert main(["serve", "--data-dir", str(tmp_path / "data"), "--port", str(free_port())]) == 0
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
    record = logging.getLogger("infersight.test").makeRecord(
        "infersight.test",
        logging.INFO,
        __file__,
        1,
        "posting to %s",
        ("https://u:pw@h.example/x?key=K",),
        None,
    )
    assert record.getMessage() == "posting to https://***@h.example/x?***"


def _data_dir_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "data directory" in r.getMessage()]  # fmt: skip


def test_an_older_data_directory_is_narrowed_and_its_exposed_token_rotated(
    tmp_path: Path, open_umask: None, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = dataclasses.replace(config(tmp_path), token=None)  # the token kept in data_dir/api-token
    data = Path(cfg.data_dir)
    with running(cfg) as (app, client):
        old_token = app.state.token
        assert (
            client.get("/api/v1/dataset", params={"version": "v"}, headers=auth(old_token)).status_code == 200
        )
    # what an older version left under a umask of 0022: everything readable by every user
    (data / "snapshots").mkdir(exist_ok=True)
    (data / "snapshots" / "2026-01-01T00-00-00Z.json").write_text('{"prompt": "my card number is"}')
    (data / "exports").mkdir()
    (data / "exports" / "v1.jsonl").write_text('{"prompt": "hello"}\n')
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not the service's")
    (data / "link").symlink_to(outside)
    for path in (data, data / "snapshots", data / "exports"):
        path.chmod(0o755)
    for path in (data / "api-token", data / "infersight.sqlite", data / "snapshots" / "2026-01-01T00-00-00Z.json",
                 data / "exports" / "v1.jsonl", outside):  # fmt: skip
        path.chmod(0o644)
    caplog.clear()
    with caplog.at_level(logging.WARNING), running(cfg) as (app, client):
        new_token = app.state.token
        (warning,) = _data_dir_warnings(caplog)  # one line says everything that changed
        for name in (
            "snapshots/2026-01-01T00-00-00Z.json",
            "exports/v1.jsonl",
            "infersight.sqlite",
            "snapshots",
        ):
            assert name in warning, warning
        assert "rotated" in warning and "api-token" in warning
        assert old_token not in caplog.text and new_token not in caplog.text
        # the exposed token no longer opens anything; the new one, in a 0600 file, does
        assert new_token != old_token and (data / "api-token").read_text().strip() == new_token
        assert (
            client.get("/api/v1/dataset", params={"version": "v"}, headers=auth(old_token)).status_code == 401
        )
        assert (
            client.get("/api/v1/dataset", params={"version": "v"}, headers=auth(new_token)).status_code == 200
        )
    assert _mode(data) == 0o700 and _mode(data / "snapshots") == 0o700 and _mode(data / "exports") == 0o700
    for path in data.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert _mode(path) == 0o600, path
    assert _mode(outside) == 0o644  # a link out of the directory is not followed
    caplog.clear()
    with caplog.at_level(logging.WARNING), running(cfg) as (app, _):
        assert _data_dir_warnings(caplog) == [] and app.state.token == new_token  # nothing left to narrow


def test_a_token_file_only_its_owner_reads_is_kept_even_if_the_directory_was_open(
    tmp_path: Path, open_umask: None, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = dataclasses.replace(config(tmp_path), token=None)
    with running(cfg) as (app, _):
        token = app.state.token
    Path(cfg.data_dir).chmod(0o711)  # others could enter, but not read the 0600 token
    with caplog.at_level(logging.WARNING), running(cfg) as (app, _):
        assert app.state.token == token
        (warning,) = _data_dir_warnings(caplog)
        assert ". (0711)" in warning and "rotated" not in warning
    assert _mode(Path(cfg.data_dir)) == 0o700


def test_with_a_configured_token_an_open_token_file_is_narrowed_not_replaced(
    tmp_path: Path, open_umask: None, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(tmp_path)  # the token comes from the configuration (INFERSIGHT_TOKEN)
    data = Path(cfg.data_dir)
    data.mkdir(parents=True)
    (data / "api-token").write_text(f"{cfg.token}\n")  # as a deployment script might have left it
    (data / "api-token").chmod(0o644)
    with caplog.at_level(logging.WARNING), running(cfg) as (app, _):
        assert app.state.token == cfg.token
        (warning,) = _data_dir_warnings(caplog)
        assert "api-token (0644)" in warning and "rotated" not in warning
    assert (data / "api-token").read_text().strip() == cfg.token and _mode(data / "api-token") == 0o600
