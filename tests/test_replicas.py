"""Two real `infersight serve` processes on the machine's PostgreSQL act as one system
(docs/scaling.md): traffic served by the follower reaches the
rules, the rollback runs on the replica that serves the alerted version and had the
traffic, and a replica taking over from a killed leader carries on the same incident.

Pages go to a local stand-in for PagerDuty's Events API v2 (its servers are out of reach)
that refuses events the real one would refuse (test_alerts_support.LocalReceiver)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from test_alerts_support import ROUTING_KEY, LocalReceiver

from tests._demo_registry import BAD, GOOD, private_copy, shared_demo_registry
from tests._service_support import TOKEN, wait_for
from tests.conftest import free_port

START_TIMEOUT_S = 120.0  # two processes importing torch and loading the model on a busy 2-core machine


@dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {TOKEN}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
        return json.loads(raw) if path != "/metrics" else raw.decode()

    def serving(self) -> str | None:
        return self.call("GET", "/api/v1/models")["serving_version"]

    def leading(self) -> bool:
        return "infersight_leader 1.0" in self.call("GET", "/metrics")

    def complete(self, n: int) -> None:
        for i in range(n):
            self.call("POST", "/v1/completions", {"prompt": f"where is my card {i}?", "max_tokens": 4})


def _rules(path: Path, pager_url: str, *, rollback: bool) -> Path:
    actions = (
        "        actions:\n          - {type: rollback, cooldown: 0s, daily_cap: 5}\n" if rollback else ""
    )
    path.write_text(
        "groups:\n"
        "  - name: replicas\n"
        "    interval: 1s\n"
        "    rules:\n"
        "      - alert: SlowVersion\n"
        "        signal: {kind: latency_quantile, metric: request_duration, quantile: 0.99, window: 2m}\n"
        '        op: ">"\n'
        "        threshold: 0.001\n"
        "        by: [model, model_version]\n"
        "        labels: {severity: critical}\n"
        '        annotations: {summary: "p99 of {{ $labels.model_version }} is {{ $value }}s"}\n'
        f"{actions}"
        "receivers:\n"
        f'  - name: pager\n    pagerduty: {{url: "{pager_url}", routing_key: "{ROUTING_KEY}"}}\n'
        "route:\n"
        "  receiver: pager\n"
        "  group_by: [alertname, model_version]\n"
        "  group_wait: 0s\n"
        "  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
    )
    return path


def _spawn(name: str, root: Path, registry: Path, database_url: str, rules: Path) -> Replica:
    port = free_port()
    config = root / f"{name}.yaml"
    config.write_text(
        json.dumps(
            {
                "data_dir": str(root / name),
                "port": port,
                "database_url": database_url,
                "engine": {
                    "registry": str(private_copy(registry, root / f"{name}-registry")),
                    "version": GOOD,
                },
                "alerting": {"rules": str(rules)},
                "drift": {"enabled": False},
                "schedule": {"rules_s": 0.25, "outbox_s": 0.25, "publish_s": 0.25, "post_deploy_s": 0.5},
            }
        )
    )
    log = root / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "INFERSIGHT_TOKEN": TOKEN}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "infersight.monitor.cli", "serve", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    return Replica(name, port, process, log)


def _ready(replica: Replica) -> bool:
    if replica.process.poll() is not None:
        log = replica.log.read_text()[-3000:]
        raise AssertionError(f"{replica.name} exited {replica.process.returncode}:\n{log}")
    try:
        with urllib.request.urlopen(replica.url + "/readyz", timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _stop(replica: Replica) -> None:
    if replica.process.poll() is None:
        replica.process.send_signal(signal.SIGINT)
        try:
            replica.process.wait(20)
        except subprocess.TimeoutExpired:
            replica.process.kill()
            replica.process.wait(10)


@pytest.fixture
def demo_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_demo_registry(tmp_path_factory)


@pytest.fixture
def system(
    tmp_path: Path, postgres_url: str, demo_registry: Path, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """A pager stand-in and two replicas started together: (leader, follower, pager, db)."""
    with ExitStack() as stack:
        pager = stack.enter_context(LocalReceiver(kind="pagerduty"))
        rules = _rules(tmp_path / "rules.yaml", pager.url, rollback=request.param)
        replicas = [_spawn(name, tmp_path, demo_registry, postgres_url, rules) for name in ("a", "b")]
        for replica in replicas:
            stack.callback(_stop, replica)
        db = create_engine(postgres_url)
        stack.callback(db.dispose)
        try:
            wait_for(lambda: all(_ready(r) for r in replicas), timeout=START_TIMEOUT_S, interval=0.25)
            leading = wait_for(lambda: [r for r in replicas if r.leading()], timeout=30.0, interval=0.25)
            assert len(leading) == 1, "one leader"
            (leader,) = leading
            (follower,) = [r for r in replicas if r is not leader]
            yield leader, follower, pager, db
        except BaseException:
            for r in replicas:
                print(f"--- {r.name} log ---\n{r.log.read_text()[-4000:]}")
            raise


def _triggers(pager: LocalReceiver, version: str) -> list[dict[str, Any]]:
    out = []
    for r in list(pager.requests):
        event = r.json()
        if (
            r.status == 202
            and event.get("event_action") == "trigger"
            and event["payload"]["source"] == version
        ):
            out.append(event)
    return out


@pytest.mark.parametrize("system", [True], indirect=True)
def test_traffic_to_the_follower_rolls_back_the_follower_alone_and_pages_once_pagerduty_stand_in(
    system: Any,
) -> None:
    leader, follower, pager, db = system
    assert leader.leading() and not follower.leading()
    for replica in (leader, follower):
        assert replica.call("POST", "/api/v1/models/deploy", {"version": BAD})["to_version"] == BAD

    follower.complete(6)

    wait_for(lambda: follower.serving() == GOOD, timeout=60.0, interval=0.25)
    wait_for(lambda: _triggers(pager, BAD), timeout=30.0, interval=0.25)
    time.sleep(3.0)  # several more evaluations and outbox runs: nothing else may go out
    assert leader.serving() == BAD, "the leader served no traffic of the alerted version: untouched"
    assert follower.serving() == GOOD
    pages = _triggers(pager, BAD)
    assert len(pages) == 1, pages
    assert pages[0]["payload"]["class"] == "SlowVersion"
    assert not pager.duplicates
    assert not [r for r in pager.requests if r.status != 202], "every event passed the schema check"
    firing = 'infersight_alerts_firing{alertname="SlowVersion",severity="critical"} 1.0'
    assert firing in leader.call("GET", "/metrics"), "store-wide figures: from the leader"
    assert "infersight_alerts_firing{" not in follower.call("GET", "/metrics"), "and from it alone"

    with db.connect() as conn:
        runs = conn.execute(text("SELECT state, replica, detail FROM alert_action_runs ORDER BY id")).all()
        analyses = conn.execute(text("SELECT state FROM alert_deploy_analyses")).scalars().all()
        follower_id = conn.execute(
            text("SELECT id FROM replicas WHERE pid = :pid"), {"pid": follower.process.pid}
        ).scalar_one()
    assert [(r.state, r.replica) for r in runs] == [("dispatched", None), ("succeeded", follower_id)], runs
    assert json.loads(runs[0].detail)["replicas"] == [follower_id]
    assert analyses == ["running"], "one post-deploy analysis for the release both replicas reported"
    deploys = [
        (d["to_version"], d["reason"], d["replicas"])
        for d in leader.call("GET", "/api/v1/overview")["deploys"]
    ]
    assert deploys[:2] == [(GOOD, "rollback", 1), (BAD, "deploy", 2)], "one release on two replicas: one item"


@pytest.mark.parametrize("system", [False], indirect=True)
def test_a_replica_taking_over_from_a_killed_leader_carries_on_the_incident_without_a_second_page(
    system: Any,
) -> None:
    leader, follower, pager, db = system
    leader.complete(6)
    wait_for(lambda: _triggers(pager, GOOD), timeout=30.0, interval=0.25)
    with db.connect() as conn:
        (episode,) = conn.execute(text("SELECT episode FROM alerts WHERE state = 'firing'")).scalars().all()

    time.sleep(1.0)  # the leader's last intervals are published (every 0.25 s)
    leader.process.send_signal(signal.SIGKILL)
    leader.process.wait(10)
    wait_for(follower.leading, timeout=30.0, interval=0.25)
    time.sleep(2.0)  # the new leader evaluates the rule several times before any traffic of its own
    follower.complete(3)
    time.sleep(3.0)

    with db.connect() as conn:
        alerts = conn.execute(text("SELECT state, episode FROM alerts")).all()
        moves = conn.execute(text("SELECT to_state FROM alert_history ORDER BY id")).scalars().all()
    assert [(a.state, a.episode) for a in alerts] == [("firing", episode)], "the same incident, still firing"
    assert "resolved" not in moves, moves
    pages = _triggers(pager, GOOD)
    assert len(pages) == 1, pages
    assert not [r for r in pager.requests if json.loads(r.body).get("event_action") == "resolve"]
