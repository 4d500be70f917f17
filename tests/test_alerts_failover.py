"""Failover end to end: a process whose memory really grows makes the shipped
`GPUMemoryLeak` rule fire in a running service, and its `failover` action switches the
REAL embedded runtime (tiny Mixtral checkpoints written with transformers' save_pretrained)
to the designated backup version. Without a backup the failover is refused, and the
refusal pages as `RemediationFailed` through the normal notification path.

The GPU is the one stand-in, at the pynvml boundary (`ChildRSSAsGPUMemoryFakeNVML`): its
device's "memory used" is the resident memory of a real child process that keeps
allocating. The rule is the shipped one (signal, threshold of 50 MiB/min, actions) with its
time scale shortened from `for: 15m` over a 30-minute window to seconds; the child grows
at about 300 MiB/min, six times the threshold."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from _service_support import config, running, wait_for
from _tiny_registry import tiny_registry
from infersight.alerts import ActionRunner, RuntimeControl
from infersight.alerts.actions.runner import FAILURE_ALERT
from infersight.alerts.rules.rules import ActionSpec
from infersight.collectors.fake_nvml import FakeDevice, FakeNVML
from infersight.monitor.service import ConfigInvalid, EngineConfig
from infersight.monitor.service.config import AlertingConfig, ScheduleConfig
from infersight.monitor.store.tables import action_runs, alerts
from sqlalchemy import select
from test_alerts_support import WHSEC, Clock, LocalReceiver, database

V0, V1 = "mixtral_tiny_fp32-v1.0", "mixtral_tiny_fp32-v1.1"

# once told to start (a line on stdin), allocates and touches 1 MiB every 200 ms, up to 200 MiB
_LEAKER = """
import sys, time
sys.stdin.readline()
held = []
while True:
    if len(held) < 200:
        held.append(bytearray(b"\\x01") * (1 << 20))
    time.sleep(0.2)
"""


class ChildRSSAsGPUMemoryFakeNVML(FakeNVML):
    """Stand-in for pynvml at its function boundary: device 0's used memory is a real
    process's resident memory, read at each call."""

    def __init__(self, pid: int) -> None:
        super().__init__([FakeDevice(memory_used=0)])
        self.process = psutil.Process(pid)

    def nvmlDeviceGetMemoryInfo(self, d: FakeDevice, version: int | None = None) -> Any:
        d.memory_used = int(self.process.memory_info().rss)
        return super().nvmlDeviceGetMemoryInfo(d, version)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_registry(tmp_path_factory.mktemp("failover"), (V0, V1))


def start_leaking(child: subprocess.Popen[bytes]) -> None:
    assert child.stdin is not None
    child.stdin.write(b"go\n")
    child.stdin.flush()


@pytest.fixture
def leaking_process() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", _LEAKER], stdin=subprocess.PIPE)
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)


def shipped_leak_rule_in_seconds(tmp_path: Path, hook_url: str) -> Path:
    """The shipped GPUMemoryLeak rule, unchanged but for its time scale, and a webhook."""
    shipped = yaml.safe_load(resources.files("infersight.alerts").joinpath("default_rules.yaml").read_text())
    [rule] = [r for g in shipped["groups"] for r in g["rules"] if r["alert"] == "GPUMemoryLeak"]
    assert rule["threshold"] == 50 * 1024 * 1024 and [a["type"] for a in rule["actions"]] == [
        "snapshot",
        "failover",
    ]
    rule = {**rule, "for": "2s", "keep_firing_for": "1m", "signal": {**rule["signal"], "window": "10s"}}
    doc = {
        "groups": [{"name": "gpu", "interval": "500ms", "rules": [rule]}],
        "receivers": [{"name": "hook", "webhook": {"url": hook_url, "secret": WHSEC}}],
        "route": {"receiver": "hook", "group_wait": "0s", "group_interval": "1s"},
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _service_config(tmp_path: Path, registry: Path, rules: Path, backup: str | None) -> Any:
    return config(
        tmp_path,
        engine=EngineConfig(registry=registry, version=V0, backup_version=backup, max_seq_len=64),
        alerting=AlertingConfig(rules=rules),
        schedule=ScheduleConfig(sample_s=0.2, rules_s=0.2, outbox_s=0.3, timeseries_s=1.0),
    )


def _runs(app: Any, action: str) -> list[Any]:
    with app.state.service.db.connect() as conn:
        return conn.execute(select(action_runs).where(action_runs.c.action == action)).all()


def test_growing_process_memory_fires_the_shipped_leak_rule_and_fails_over_to_the_backup(
    tmp_path: Path, registry: Path, leaking_process: subprocess.Popen[bytes]
) -> None:
    nvml = ChildRSSAsGPUMemoryFakeNVML(leaking_process.pid)
    with LocalReceiver() as hook:
        cfg = _service_config(tmp_path, registry, shipped_leak_rule_in_seconds(tmp_path, hook.url), V1)
        with running(cfg, nvml=nvml) as (app, _client):
            runtime = app.state.service.parts.backend.runtime
            assert runtime.serving_version == V0
            time.sleep(2.0)  # about ten evaluations of a process whose memory holds still: nothing happens
            assert _runs(app, "failover") == [] and runtime.serving_version == V0
            start_leaking(leaking_process)
            [run] = wait_for(lambda: [r for r in _runs(app, "failover") if r.state != "pending"], timeout=60)
            assert (run.state, run.alertname, run.before_version, run.after_version) == (
                "succeeded", "GPUMemoryLeak", V0, V1,
            )  # fmt: skip
            assert runtime.serving_version == V1  # the engine itself switched
            last = runtime.history()[-1]
            assert (last.from_version, last.to_version, last.reason) == (V0, V1, "failover")
            with app.state.service.db.connect() as conn:
                names = {r.alertname for r in conn.execute(select(alerts).where(alerts.c.state == "firing"))}
            assert "GPUMemoryLeak" in names and FAILURE_ALERT not in names
            # the evidence was kept first, of the version that leaked
            [snap] = _runs(app, "snapshot")
            assert snap.state == "succeeded" and snap.before_version == V0


def test_failover_without_a_backup_is_refused_and_pages_remediation_failed(
    tmp_path: Path, registry: Path, leaking_process: subprocess.Popen[bytes]
) -> None:
    nvml = ChildRSSAsGPUMemoryFakeNVML(leaking_process.pid)
    with LocalReceiver() as hook:
        cfg = _service_config(tmp_path, registry, shipped_leak_rule_in_seconds(tmp_path, hook.url), None)
        with running(cfg, nvml=nvml) as (app, _client):
            start_leaking(leaking_process)
            [run] = wait_for(lambda: [r for r in _runs(app, "failover") if r.state != "pending"], timeout=60)
            assert run.state == "refused" and json.loads(run.detail)["refused"] == "bad_parameters"
            assert app.state.service.parts.backend.runtime.serving_version == V0

            def paged() -> list[Any]:
                return [
                    a for r in hook.requests if r.status == 200
                    for a in r.json()["alerts"] if a["labels"]["alertname"] == FAILURE_ALERT
                ]  # fmt: skip

            [page, *_] = wait_for(paged, timeout=30)
            assert page["labels"]["action"] == "failover" and page["labels"]["outcome"] == "refused"
            assert page["labels"]["source_alert"] == "GPUMemoryLeak"
            assert "no backup version designated" in page["annotations"]["summary"]


def test_an_unregistered_backup_version_is_refused_at_start(tmp_path: Path, registry: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("groups: []\n")
    cfg = _service_config(tmp_path, registry, rules, "mixtral_tiny_fp32-v9.9")
    from infersight.monitor.service import Service

    service = Service(cfg)
    with pytest.raises(ConfigInvalid, match=r"engine\.backup_version.*v9\.9"):
        service.start()
    service.stop()


def test_a_rule_naming_an_unregistered_backup_is_refused_at_start_with_its_line(
    tmp_path: Path, registry: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: Leak\n"
        "        signal: {kind: memory_slope, resource: gpu, window: 5m}\n        op: '>'\n"
        "        threshold: 1\n        actions: [{type: failover, backup: nope-v1.0}]\n"
    )
    from infersight.monitor.service import Service

    service = Service(_service_config(tmp_path, registry, rules, V1))
    with pytest.raises(ConfigInvalid, match=r"rules\.yaml:4: rule Leak: failover backup 'nope-v1.0'"):
        service.start()
    service.stop()


def test_backup_version_comes_from_the_config_file_and_the_flag(tmp_path: Path, registry: Path) -> None:
    import argparse

    from infersight.monitor.cli import _serve
    from infersight.monitor.service import load_config

    path = tmp_path / "infersight.yaml"
    path.write_text(f"engine:\n  registry: {registry}\n  backup_version: {V1}\n")
    assert load_config(path).engine.backup_version == V1  # type: ignore[union-attr]
    parser = argparse.ArgumentParser()
    _serve.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--registry", str(registry), "--backup-version", V0])
    assert _serve.build_config(args, {}).engine.backup_version == V0
    from infersight.monitor.cli import CommandError

    with pytest.raises(CommandError, match="--backup-version"):
        _serve.build_config(
            parser.parse_args(["serve", "--upstream", "http://x", "--backup-version", V0]), {}
        )


def test_a_refused_rollback_pages_remediation_failed_and_a_snapshot_never_does(
    tmp_path: Path, request: Any
) -> None:
    with database("sqlite", tmp_path, request) as engine:
        runner = ActionRunner(engine, data_dir=tmp_path, control=None, clock=Clock())  # proxy mode: no engine
        out = runner.run(ActionSpec("rollback"), trigger="rule", alertname="ErrorRateSpike")
        assert out.state == "refused"
        snapshot = ActionSpec("snapshot", (("requests", 1),), cooldown_s=3600)
        assert [runner.run(snapshot).state for _ in range(2)] == ["succeeded", "refused"]  # cooldown
        with engine.connect() as conn:
            [row] = conn.execute(select(alerts).where(alerts.c.alertname == FAILURE_ALERT)).all()
        labels = json.loads(row.labels)
        assert (row.state, labels["action"], labels["outcome"]) == ("firing", "rollback", "refused")
        assert "unavailable" in json.loads(row.annotations)["summary"]


def test_a_failover_refused_by_its_cooldown_after_one_that_worked_does_not_page(
    tmp_path: Path, registry: Path, request: Any
) -> None:
    from infersight.engine.registry import Registry
    from infersight.engine.runtime import Runtime

    runtime = Runtime(Registry(registry), max_batch_size=2, max_seq_len=64, max_prompt_tokens=16)
    runtime.start(V0)
    try:
        with database("sqlite", tmp_path, request) as engine:
            clock = Clock()
            runner = ActionRunner(engine, data_dir=tmp_path, control=RuntimeControl(runtime), backup_version=V1,
                                  clock=clock)  # fmt: skip
            spec = ActionSpec("failover", cooldown_s=3600, daily_cap=1)
            assert runner.run(spec, trigger="rule", alertname="GPUMemoryLeak").state == "succeeded"
            clock.advance(60)  # a second GPU's leak alert, a minute later
            again = runner.run(spec, trigger="rule", alertname="GPUMemoryLeak")
            assert (again.state, again.detail["refused"]) == ("refused", "cooldown")
            with engine.connect() as conn:
                assert conn.execute(select(alerts).where(alerts.c.alertname == FAILURE_ALERT)).all() == []
            clock.advance(3600)  # past the cooldown, but the daily cap of 1 is spent: that pages
            capped = runner.run(spec, trigger="rule", alertname="GPUMemoryLeak")
            assert (capped.state, capped.detail["refused"]) == ("refused", "daily_cap")
            with engine.connect() as conn:
                [page] = conn.execute(select(alerts).where(alerts.c.alertname == FAILURE_ALERT)).all()
            assert json.loads(page.labels)["outcome"] == "refused" and runtime.serving_version == V1
    finally:
        runtime.stop(drain=False)
