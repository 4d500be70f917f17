"""`infersight serve`'s config: YAML file, environment secrets, flags, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from infersight.monitor.cli import main
from infersight.monitor.service import ConfigInvalid, load_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "infersight.yaml"
    path.write_text(text)
    return path


def test_a_full_config_file_is_read_with_paths_relative_to_it(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
data_dir: data
host: 127.0.0.1
port: 9100
engine: {registry: models, version: mixtral_banking_int8-v1.2, max_batch_size: 16}
alerting: {rules: rules.yaml, analysis_failed_checks: 2}
drift: {reference: ref.jsonl, alpha: 0.01, window: 500}
retention: {requests_days: 7, snapshots_days: null}
schedule: {drift_s: 120}
limits: {max_body_bytes: 1048576}
""",
    )
    cfg = load_config(path, {"INFERSIGHT_TOKEN": "s3cret-token-from-the-env"})
    assert cfg.data_dir == tmp_path / "data" and cfg.port == 9100
    assert (
        cfg.engine is not None
        and cfg.engine.registry == tmp_path / "models"
        and cfg.engine.max_batch_size == 16
    )
    assert cfg.alerting.rules == tmp_path / "rules.yaml" and cfg.alerting.analysis_failed_checks == 2
    assert cfg.drift.reference == tmp_path / "ref.jsonl" and cfg.drift.alpha == 0.01
    assert cfg.retention.requests_days == 7 and cfg.retention.snapshots_days is None
    assert cfg.token == "s3cret-token-from-the-env"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("engine: {registri: x}", "engine.registri"),
        ("port: eighty", "port"),
        ("port: 70000", "port"),
        ("drift: {alpha: 2}", "drift.alpha"),
        ("engine: {registry: m, pair_share: 1.5}", "engine.pair_share"),
        ("engine: {registry: m, pair_slots: 0}", "engine.pair_slots"),
        ("drift: {embedder: tensorrt}", "drift.embedder"),
        ("drift: {embed_threads: 0}", "drift.embed_threads"),
        ("drift: {embed_cpu: 0}", "drift.embed_cpu"),
        ("drift: {embed_cpu: lots}", "drift.embed_cpu"),
        ("drift: {reservoir: 0}", "drift.reservoir"),
        ("schedule: {rules_s: 0}", "schedule.rules_s"),
        ("upstream: {url: ftp://x}", "upstream.url"),
        ("engine: {registry: m}\nupstream: {url: 'http://x'}", "upstream"),
        ("token: short", "token"),  # refused wherever it came from: a token is never in the file
        ("retention: {requests_days: -3}", "retention"),
        ("[1, 2", "line 1"),
    ],
)
def test_a_bad_config_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigInvalid) as info:
        load_config(_write(tmp_path, text), {})
    assert str(info.value).startswith(f"{tmp_path / 'infersight.yaml'}: {field}")


def test_serve_reports_config_errors_as_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", str(_write(tmp_path, "port: eighty"))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "port: must be an integer" in err
    assert main(["serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path)]) == 2
    assert "without a token" in capsys.readouterr().err
    assert main(["serve", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_token_in_the_config_file_is_refused_with_where_it_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "token: a-long-enough-secret-token\nport: 8321")
    with pytest.raises(ConfigInvalid, match="INFERSIGHT_TOKEN"):
        load_config(path, {"INFERSIGHT_TOKEN": "s3cret-token-from-the-env"})
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "token: the token does not go in the config file" in err, err
    assert "a-long-enough-secret-token" not in err
