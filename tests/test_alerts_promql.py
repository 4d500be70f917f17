"""`infersight rules export` writes a Prometheus rule file that the real promtool accepts
and whose latency and memory rules fire (and stay quiet) as infersight's own do."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from conftest import require_executable
from infersight.alerts import export_prometheus, load_config
from infersight.alerts.rules.rules import render
from infersight.monitor.cli import main

_SLOW = 'gen_ai_server_request_duration_seconds_bucket{{model="m",model_version="v1",le="{le}"}}'
_FAST = 'gen_ai_server_request_duration_seconds_bucket{{model="m",model_version="v2",le="{le}"}}'
_MEM = 'infersight_gpu_memory_used_bytes{{gpu="{gpu}",uuid="GPU-{gpu}"}}'


def _export(tmp_path: Path) -> Path:
    out = tmp_path / "infersight.rules.yml"
    assert main(["rules", "export", str(out)]) == 0
    return out


def test_export_passes_promtool_check(tmp_path: Path) -> None:
    promtool = require_executable("promtool")
    out = _export(tmp_path)
    run = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    exported = export_prometheus(load_config())  # rules whose signal has no PromQL form are skipped, named
    assert len(exported.exported) + len(exported.skipped) == len(load_config().rules)
    assert f"SUCCESS: {len(exported.exported)} rules found" in run.stdout


def test_export_uses_the_documented_metric_names() -> None:
    text = export_prometheus(load_config(env={})).text
    assert "rate(gen_ai_server_request_duration_seconds_bucket[5m])" in text
    assert "deriv(infersight_gpu_memory_used_bytes[30m])" in text
    assert 'infersight_drift_p_value{field="prompt"}' in text
    assert "gen_ai_server_requests_waiting" in text


def _series(template: str, per_minute: dict[str, str], **kw: str) -> list[dict[str, str]]:
    return [{"series": template.format(le=le, **kw), "values": v} for le, v in per_minute.items()]


def test_promtool_unit_tests_of_latency_and_memory_rules(tmp_path: Path) -> None:
    promtool = require_executable("promtool")
    out = _export(tmp_path)
    config = load_config(env={})
    # v1: 60 requests a minute, every one between 2.5 s and 5 s; v2: all under 0.5 s.
    slow = _series(_SLOW, {"0.5": "0x30", "1": "0x30", "2.5": "0x30", "5": "0+60x30", "+Inf": "0+60x30"})
    fast = _series(_FAST, {le: "0+60x30" for le in ("0.5", "1", "2.5", "5", "+Inf")})
    # GPU 0 leaks 100 MB a minute; GPU 1 is flat.
    leak = [
        {"series": _MEM.format(gpu="0"), "values": "1000000000+100000000x40"},
        {"series": _MEM.format(gpu="1"), "values": "1000000000+0x40"},
    ]
    p99 = 2.5 + (5 - 2.5) * 0.99  # histogram_quantile interpolates inside the (2.5, 5] bucket
    latency_alerts = []
    for severity in ("warning", "critical"):
        rule = next(r for r in config.rules if r.name == "TailLatencyOverSLA" and r.severity == severity)
        labels = {"model": "m", "model_version": "v1", "severity": severity, "team": "ml-platform"}
        annotations = {k: render(v, labels, p99) for k, v in rule.annotations}  # infersight's own rendering
        latency_alerts.append({"exp_labels": labels, "exp_annotations": annotations})
    leak_rule = config.rule("GPUMemoryLeak")
    leak_labels = {"gpu": "0", "uuid": "GPU-0", "severity": "critical", "team": "ml-platform"}
    tests = {
        "rule_files": [str(out)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": slow + fast + leak,
                "alert_rule_test": [
                    {
                        "eval_time": "1m",
                        "alertname": "TailLatencyOverSLA",
                        "exp_alerts": [],
                    },  # pending (for: 2m)
                    {"eval_time": "10m", "alertname": "TailLatencyOverSLA", "exp_alerts": latency_alerts},
                    {
                        "eval_time": "10m",
                        "alertname": "GPUMemoryLeak",
                        "exp_alerts": [],
                    },  # pending (for: 15m)
                    {
                        "eval_time": "25m",
                        "alertname": "GPUMemoryLeak",
                        "exp_alerts": [
                            {
                                "exp_labels": leak_labels,
                                "exp_annotations": {
                                    k: render(v, leak_labels, 1e8) for k, v in leak_rule.annotations
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "tests.yml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    run = subprocess.run(
        [promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_export_to_unwritable_path_is_one_line_error(tmp_path: Path, capsys: object) -> None:
    (tmp_path / "file").write_text("")
    assert main(["rules", "export", str(tmp_path / "file" / "x.yml")]) == 2
