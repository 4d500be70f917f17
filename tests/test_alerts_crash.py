"""Never lost: a real process evaluates rules and delivers notifications while the
receiver fails; it is killed with SIGKILL in the middle of a delivery, restarted, and
every notification ends up accepted exactly once per idempotency key at a real local
HTTP receiver that dedups by key (as a real receiver does) and counts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from infersight.monitor.store.tables import outbox
from sqlalchemy import Engine, select
from test_alerts_support import WHSEC, LocalReceiver, database

CHILD = r"""
import random, sys, time
from infersight.alerts import Dispatcher, Evaluator, HttpxSender, build_receivers
from infersight.alerts.notify.receivers import RetryPolicy
from infersight.alerts.rules.config import parse_config
from infersight.alerts.rules.signals import StaticSignals
from infersight.monitor.store import connect

url, hook, phase = sys.argv[1], sys.argv[2], sys.argv[3]
rules = '''
groups:
  - name: g
    interval: 1s
    rules:
      - alert: Slow
        signal: {kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 1m}
        op: ">"
        threshold: 2
        by: [model_version]
        labels: {severity: critical}
receivers:
  - name: hook
    webhook: {url: "HOOK", secret: "WHSEC"}
route: {receiver: hook, group_by: [alertname, model_version], group_wait: 0s, group_interval: 1h}
'''.replace("HOOK", hook).replace("WHSEC", sys.argv[4])
engine = connect(url)
config = parse_config(rules)
policy = RetryPolicy(base_s=0.05, cap_s=0.2, lease_s=1.5)
dispatcher = Dispatcher(engine, build_receivers(config.receivers), HttpxSender(), policy=policy)
if phase == "first":
    signals = StaticSignals()
    for v in range(5):
        signals.set("latency_quantile", 3.0, model_version=f"v{v}")
    Evaluator(engine, config, signals).evaluate()
    print("evaluated", flush=True)
deadline = time.time() + 60
while time.time() < deadline:
    if not dispatcher.run_once(limit=1):
        with engine.connect() as conn:
            left = conn.exec_driver_sql("SELECT count(*) FROM alert_outbox WHERE state = 'pending'").scalar()
        if phase == "second" and left == 0:
            print("drained", flush=True)
            sys.exit(0)
        time.sleep(0.05)
sys.exit(3)
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with database(request.param, tmp_path, request) as engine:
        yield engine


def _child(url: str, hook: str, phase: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, hook, phase, WHSEC],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_sigkill_during_failing_deliveries_loses_nothing_and_duplicates_nothing(db: Engine) -> None:
    url = db.url.render_as_string(hide_password=False)
    failures = 6  # the first six attempts get 503; the seventh is accepted but answered only after the kill
    receiver = LocalReceiver(
        kind="webhook",
        script=lambda n: (503, {}) if n < failures else (200, {}),
        hold_s=lambda n: 5.0 if n == failures else 0.0,
    )
    with receiver:
        first = _child(url, receiver.url, "first")
        try:
            assert receiver.holding.wait(30), "the child never got past the failing deliveries"
            os.kill(first.pid, signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        finally:
            if first.poll() is None:
                first.kill()
        held_key = receiver.requests[failures].key
        assert [r.status for r in receiver.requests[:failures]] == [503] * failures
        with db.connect() as conn:
            rows = conn.execute(select(outbox.c.idempotency_key, outbox.c.state)).all()
        assert len(rows) == 5 and dict(rows)[held_key] == "pending"  # accepted, but the process died first
        started = time.monotonic()
        second = _child(url, receiver.url, "second")
        out, err = second.communicate(timeout=90)
        assert second.returncode == 0, err[-2000:]
        assert "drained" in out and time.monotonic() - started < 60
    with db.connect() as conn:
        rows = conn.execute(select(outbox.c.idempotency_key, outbox.c.state)).all()
    keys = {k for k, _ in rows}
    assert {s for _, s in rows} == {"delivered"}
    assert dict(receiver.accepted) == {k: 1 for k in keys}  # every notification, exactly once per key
    assert dict(receiver.duplicates) == {held_key: 1}  # the redelivery after the kill, recognised by its key
