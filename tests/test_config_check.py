"""`infersight config check FILE` names the bad key with its line and kind; `config schema`
prints a JSON Schema that accepts the shipped example and every key the code knows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("yaml")
pytest.importorskip("fastapi")

from infersight.monitor.cli import main
from infersight.monitor.service import errors
from infersight.monitor.service.config_schema import ENV_ONLY, check_file, config_keys, json_schema


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "infersight.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "error", "key", "line"),
    [
        ("port: 8000\nlimits:\n  bogus: 1\n", errors.ConfigKeyUnknown, "limits.bogus", 3),
        ("drift:\n  alpha: 0.05\n  window: many\n", errors.ConfigTypeWrong, "drift.window", 3),
        (
            "port: 8000\nengine:\n  registry: ./m\n  max_queue: -1\n",
            errors.ConfigValueBad,
            "engine.max_queue",
            4,
        ),
        ("retention:\n  requests_days: -1\n", errors.ConfigValueBad, "retention.requests_days", 2),
        ("\n\nupstream:\n  model: x\n", errors.ConfigKeyMissing, "upstream.url", 3),
        ("port: [8000\n", errors.ConfigNotYAML, "config", 2),
        ("port: 8000\ntoken: abcdefghijklmnopq\n", errors.ConfigValueBad, "token", 2),
        ("alerting:\n  pair_similarity: sometimes\n", errors.ConfigValueBad, "alerting.pair_similarity", 2),
        ("alerting:\n  canary_latency: net\n", errors.ConfigValueBad, "alerting.canary_latency", 2),
    ],
)
def test_each_kind_of_bad_file_is_a_typed_error_with_its_key_and_line(
    tmp_path: Path, text: str, error: type[errors.ConfigFileInvalid], key: str, line: int
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(error) as caught:
        check_file(path)
    assert (type(caught.value), caught.value.field, caught.value.line) == (error, key, line)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: {key}: ") and "\n" not in message
    assert isinstance(caught.value, errors.ConfigInvalid)  # what `serve` already catches


def test_check_prints_one_line_and_exits_1_for_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "host: 127.0.0.1\ndrift:\n  embedder: fastest\n")
    assert main(["config", "check", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(f"infersight config: error: {path}:3: drift.embedder: bad value: must be one of")


def test_a_good_file_raises_nothing(tmp_path: Path) -> None:
    assert check_file(_write(tmp_path, "drift: {embed_cpu: null}\nlimits: {max_label_values: 50}\n")) is None


def test_check_accepts_a_good_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(
        tmp_path, "port: 8001\nupstream: {url: 'http://127.0.0.1:8002'}\nlimits: {client_rate: 0}\n"
    )
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"{path}: ok"


def test_missing_file_is_one_line_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(tmp_path / "absent.yaml")]) == 1
    assert "unreadable: cannot read" in capsys.readouterr().err


def test_schema_covers_every_key_and_rejects_unknown_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == json_schema()
    for key in config_keys():
        if key.key in ENV_ONLY:
            continue
        node = schema
        for part in key.key.split("."):
            if "anyOf" in node:
                node = node["anyOf"][0]
            assert node["additionalProperties"] is False
            node = node["properties"][part]
    assert schema["properties"]["upstream"]["anyOf"][0]["required"] == ["url"]
    assert "token" not in schema["properties"]  # it comes from the environment only


def test_schema_validates_what_check_accepts_and_refuses_an_unknown_key() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json_schema())
    good = {"port": 8001, "drift": {"alpha": 0.01, "embed_cpu": None}, "allowed_hosts": ["a.example"],
            "routing": None, "cost": {"per_hour": 4.1}}  # fmt: skip
    assert not list(validator.iter_errors(good))
    assert list(validator.iter_errors({"limits": {"bogus": 1}}))
    assert list(validator.iter_errors({"drift": {"window": "many"}}))


@pytest.mark.parametrize("latency", ["whole", "own"])
def test_the_canary_controller_compares_latency_as_configured(latency: str) -> None:
    from types import SimpleNamespace

    from infersight.monitor.service.config import config_from_mapping
    from infersight.monitor.service.pair_feed import engine_release_checks

    config = config_from_mapping({"alerting": {"canary_latency": latency}}, env={})
    runtime = SimpleNamespace(canary=object())  # canary support, no pairs
    share, controller, feed = engine_release_checks(runtime, config, lambda decision: None)
    assert (share, feed) == (0.0, None) and controller.policy.latency == latency
