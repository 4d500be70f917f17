"""Actions on the REAL engine runtime (infersight.engine.Runtime serving tiny Mixtral
checkpoints written with transformers' save_pretrained): hot reload, rollback, failover,
dry run, once per key, a refused deploy that keeps the serving version and raises its
own alert; and snapshots, cooldowns and daily caps."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from infersight.alerts import ActionRunner, Evaluator, RuntimeControl
from infersight.alerts.actions.runner import FAILURE_ALERT
from infersight.alerts.rules.config import parse_config
from infersight.alerts.rules.rules import ActionSpec
from infersight.alerts.rules.signals import StaticSignals
from infersight.monitor.service.runtime_store import DeployLog
from infersight.monitor.store.tables import action_runs, alerts, deploys, outbox, requests, snapshots
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, insert, select
from test_alerts_support import WHSEC, Clock, database

V0, V1, V2, BAD = (f"mixtral_tiny_fp32-v1.{i}" for i in range(4))


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from infersight.engine.registry import Registry
    from infersight.engine.runtime import Runtime

    root = tmp_path_factory.mktemp("engine")
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
    )
    registry = Registry(root / "registry")
    for i, name in enumerate((V0, V1, V2, BAD)):
        torch.manual_seed(i)
        transformers.MixtralForCausalLM(config).save_pretrained(root / name)
        registry.register(name, root / name)
    with (root / BAD / "model.safetensors").open("ab") as f:
        f.write(b"bit rot")  # the registry's sha256 no longer matches: the engine refuses to deploy it
    rt = Runtime(registry, max_batch_size=2, max_seq_len=64, max_prompt_tokens=16)
    rt.start(V0)
    yield rt
    rt.stop(drain=False)


@pytest.fixture
def sqlite_db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


def serve(rt: Any, version: str) -> None:
    if rt.serving_version != version:
        rt.deploy(version)


def runner(
    engine: Engine, tmp_path: Path, rt: Any = None, clock: Clock | None = None, **kw: Any
) -> ActionRunner:
    control = RuntimeControl(rt) if rt is not None else None
    return ActionRunner(engine, data_dir=tmp_path, control=control, clock=clock or Clock(), **kw)


def test_hot_reload_on_real_runtime_deploys_once_per_key(
    runtime: Any, sqlite_db: Engine, tmp_path: Path
) -> None:
    serve(runtime, V0)
    r = runner(sqlite_db, tmp_path, runtime)
    spec = ActionSpec("hot_reload", (("version", V1),), cooldown_s=0)
    out = r.run(spec, key="episode-1")
    assert (out.state, out.before_version, out.after_version) == ("succeeded", V0, V1)
    assert runtime.serving_version == V1
    deploys = len(runtime.history())
    again = r.run(spec, key="episode-1")
    assert again.duplicate and again.run_id == out.run_id and len(runtime.history()) == deploys


def test_refused_deploy_on_real_runtime_keeps_serving_and_raises_an_alert(
    runtime: Any, sqlite_db: Engine, tmp_path: Path
) -> None:
    serve(runtime, V1)
    clock = Clock()
    out = runner(sqlite_db, tmp_path, runtime, clock).run(ActionSpec("hot_reload", (("version", BAD),)))
    assert out.state == "failed" and "ChecksumMismatch" in out.detail["error"]
    assert out.before_version == out.after_version == V1 == runtime.serving_version
    assert out.detail["serving_version_kept"] is True
    with sqlite_db.connect() as conn:
        alert = conn.execute(select(alerts).where(alerts.c.alertname == FAILURE_ALERT)).one()
    assert alert.state == "firing" and json.loads(alert.labels)["action"] == "hot_reload"
    assert "kept serving " + V1 in json.loads(alert.annotations)["summary"]
    # the failure alert is routed and paged like any other
    config = parse_config(
        f"groups: []\nreceivers:\n  - name: hook\n    webhook: {{url: 'http://127.0.0.1:9/', secret: '{WHSEC}'}}\n"
        "route: {receiver: hook, group_wait: 0s}\n"
    )
    Evaluator(sqlite_db, config, StaticSignals(), clock=clock).tick()
    with sqlite_db.connect() as conn:
        [note] = [json.loads(r.payload) for r in conn.execute(select(outbox))]
    assert note["alerts"][0]["labels"]["alertname"] == FAILURE_ALERT


def test_rollback_on_real_runtime_returns_to_the_previous_good_version(
    runtime: Any, sqlite_db: Engine, tmp_path: Path
) -> None:
    serve(runtime, V0)
    serve(runtime, V2)
    out = runner(sqlite_db, tmp_path, runtime).run(ActionSpec("rollback"))
    assert (out.state, out.before_version, out.after_version) == ("succeeded", V2, V0)
    assert runtime.serving_version == V0


def test_failover_on_real_runtime_switches_to_the_designated_backup(
    runtime: Any, sqlite_db: Engine, tmp_path: Path
) -> None:
    serve(runtime, V0)
    out = runner(sqlite_db, tmp_path, runtime, backup_version=V2).run(ActionSpec("failover"))
    assert (out.state, out.after_version) == ("succeeded", V2) and runtime.history()[-1].reason == "failover"
    no_backup = runner(sqlite_db, tmp_path, runtime).run(ActionSpec("failover"))
    assert no_backup.state == "refused" and no_backup.detail["refused"] == "bad_parameters"


def test_dry_run_on_real_runtime_changes_nothing(runtime: Any, sqlite_db: Engine, tmp_path: Path) -> None:
    serve(runtime, V0)
    deploys = len(runtime.history())
    out = runner(sqlite_db, tmp_path, runtime).run(ActionSpec("hot_reload", (("version", V1),), dry_run=True))
    assert out.state == "dry_run" and out.detail["would"] == f"hot_reload from {V0} to {V1}"
    assert runtime.serving_version == V0 and len(runtime.history()) == deploys


def test_same_key_from_two_threads_on_real_runtime_runs_once(
    runtime: Any, sqlite_db: Engine, tmp_path: Path
) -> None:
    serve(runtime, V0)
    deploys = len(runtime.history())
    spec = ActionSpec("hot_reload", (("version", V1),), cooldown_s=0)
    outcomes: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda: outcomes.append(runner(sqlite_db, tmp_path, runtime).run(spec, key="peer"))
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(o.duplicate for o in outcomes) == [False, True]
    assert len(runtime.history()) == deploys + 1 and runtime.serving_version == V1


def test_a_run_asked_for_here_is_not_taken_by_another_threads_queue(
    runtime: Any, sqlite_db: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The post-deploy analysis runs its rollback itself, by key, while the rules job's thread
    runs the queued actions: the analysis' run, once inserted, is not queued work for that
    thread, so the analysis learns its outcome at once and not a check later."""
    serve(runtime, V0)
    mine, other = runner(sqlite_db, tmp_path, runtime), runner(sqlite_db, tmp_path, runtime)
    taken: list[Any] = []
    insert = mine._insert

    def insert_then_the_queue_is_polled(*args: Any, **kwargs: Any) -> int:
        row_id = insert(*args, **kwargs)
        taken.extend(other.run_pending())  # the other thread, between the insert and the run
        return row_id

    monkeypatch.setattr(mine, "_insert", insert_then_the_queue_is_polled)
    out = mine.run(ActionSpec("hot_reload", (("version", V1),), cooldown_s=0), key="analysis-1")
    assert taken == []
    assert (out.state, out.duplicate, out.after_version) == ("succeeded", False, V1)
    assert runtime.serving_version == V1


class Source:
    """The service's side of a snapshot, as the service would wire it."""

    def metrics_text(self) -> str:
        return 'gen_ai_server_requests_waiting{model="bank",model_version="v1"} 3.0\n'

    def latest_drift_report(self) -> Mapping[str, Any] | None:
        return {"verdict": "drift", "p_value": 0.001}

    def version_config(self, version: str | None) -> Mapping[str, Any] | None:
        return {"name": version, "quant": "int8"}


def test_snapshot_keeps_requests_metrics_drift_and_version(sqlite_db: Engine, tmp_path: Path) -> None:
    t0 = dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC)
    with sqlite_db.begin() as conn:
        conn.execute(
            insert(requests),
            [
                {
                    "request_id": f"r{i}",
                    "model": "bank",
                    "model_version": "v1",
                    "started_at": t0 + dt.timedelta(seconds=i),
                    "duration_s": 0.1 * i,
                    "prompt": f"<b>card {i}</b>",
                    "response": "blocked",
                    "source": "sdk",
                }
                for i in range(8)
            ],
        )
    r = ActionRunner(sqlite_db, data_dir=tmp_path, snapshots=Source(), clock=Clock())
    out = r.run(ActionSpec("snapshot", (("requests", 5),)), alertname="TailLatencyOverSLA", trigger="rule")
    assert out.state == "succeeded" and out.detail["requests"] == 5
    page = Path(out.detail["path"])
    html = page.read_text()
    assert "&lt;b&gt;card 7&lt;/b&gt;" in html and "<b>card" not in html  # escaped, readable
    content = json.loads(page.with_suffix(".json").read_text())
    assert [q["request_id"] for q in content["requests"]] == ["r7", "r6", "r5", "r4", "r3"]
    assert content["drift_report"]["verdict"] == "drift" and "requests_waiting" in content["metrics"]
    with sqlite_db.connect() as conn:
        row = conn.execute(select(snapshots)).one()
    assert (row.trigger, row.request_count, row.path) == ("alert", 5, str(page))


def test_cooldown_and_daily_cap_refuse_and_dry_runs_do_not_count(sqlite_db: Engine, tmp_path: Path) -> None:
    clock = Clock()
    r = runner(sqlite_db, tmp_path, clock=clock)
    spec = ActionSpec("snapshot", (("requests", 1),), cooldown_s=600, daily_cap=2)
    assert r.run(spec).state == "succeeded"
    assert r.run(ActionSpec("snapshot", spec.params, 600, 2, dry_run=True)).detail["refused"] == "cooldown"
    clock.advance(601)
    assert r.run(spec).state == "succeeded"
    clock.advance(601)
    capped = r.run(spec)
    assert capped.state == "refused" and capped.detail["refused"] == "daily_cap"
    clock.advance(86_400)
    assert r.run(spec).state == "succeeded"


def test_actions_queued_by_a_firing_rule_run_once(sqlite_db: Engine, tmp_path: Path) -> None:
    clock, signals = Clock(), StaticSignals()
    config = parse_config(
        "groups:\n  - name: g\n    rules:\n      - alert: Drift\n        signal: {kind: drift_p_value, field: prompt}\n"
        "        op: '<'\n        threshold: 0.01\n        actions: [{type: snapshot, requests: 3}]\n"
    )
    ev = Evaluator(sqlite_db, config, signals, clock=clock)
    signals.set("drift_p_value", 0.001, model_version="v1")
    r = runner(sqlite_db, tmp_path, clock=clock)
    for _ in range(3):
        ev.evaluate()
        clock.advance(15)
        r.run_pending()
    with sqlite_db.connect() as conn:
        [run] = conn.execute(select(action_runs)).all()
    assert (run.state, run.trigger, run.alertname) == ("succeeded", "rule", "Drift")


# -- post-deploy analysis, rolling back the REAL runtime ---------------------------------


def _traffic(
    engine: Engine,
    version: str,
    start: dt.datetime,
    n: int,
    *,
    errors: int,
    duration_s: float,
    error_type: str = "GenerationFailed",
) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(requests),
            [
                {
                    "request_id": f"{version}-{start.timestamp()}-{i}",
                    "model": "tiny",
                    "model_version": version,
                    "started_at": start + dt.timedelta(seconds=i),
                    "duration_s": duration_s,
                    "error_type": error_type if i < errors else None,
                    "source": "engine",
                    "relevance": 0.6,
                }
                for i in range(n)
            ],
        )


def _analyzer(engine: Engine, tmp_path: Path, rt: Any, clock: Clock) -> Any:
    from infersight.alerts import AnalysisPolicy, DeployAnalyzer, StoreVersionMetrics

    policy = AnalysisPolicy(window_s=600, interval_s=60, baseline_s=600, max_failed_checks=3, min_requests=20)
    return DeployAnalyzer(
        engine, StoreVersionMetrics(engine), runner(engine, tmp_path, rt, clock), policy=policy, clock=clock
    )


def test_regressed_deploy_on_real_runtime_is_rolled_back_with_evidence(
    runtime: Any, sqlite_db: Engine, tmp_path: Path
) -> None:
    from infersight.alerts import REGRESSION_ALERT

    serve(runtime, V0)
    events: list[Any] = []
    unsubscribe = runtime.subscribe(events.append)
    runtime.deploy(V1)
    unsubscribe()
    # the runtime's own start may reach a new subscriber late: the deploy is the one asked for
    [deployed] = [e for e in events if type(e).__name__ == "VersionDeployed" and e.reason == "deploy"]
    clock = Clock(deployed.at)
    at = dt.datetime.fromtimestamp(deployed.at, dt.UTC)
    analyzer = _analyzer(sqlite_db, tmp_path, runtime, clock)
    _traffic(sqlite_db, V0, at - dt.timedelta(seconds=300), 60, errors=0, duration_s=0.1)
    analyzer.observe(deployed)  # the engine's VersionDeployed starts the analysis
    _traffic(sqlite_db, V1, at + dt.timedelta(seconds=1), 60, errors=15, duration_s=0.4)
    deploy_log = DeployLog(sqlite_db, runtime, CollectorRegistry(), model="tiny")
    verdicts = []
    for _ in range(3):
        clock.advance(61)
        verdicts += analyzer.tick()
    assert [v.verdict for v in verdicts] == ["failed"] * 3
    # the deploy history says why, found by the analysed deploy's time: the check's own time
    # may be later than the rollback (here by the clock; in service, when an earlier check's
    # rollback was run by another thread and this check read its outcome by key)
    assert verdicts[-1].deployed_at == at
    assert deploy_log.annotate(from_version=V1, to_version=V0, reason="rollback", since=at, detail="why")
    [row] = _history(sqlite_db, "rollback")
    assert row.detail == "why" and row.at < verdicts[-1].at - dt.timedelta(seconds=1)
    deploy_log.close()
    assert any("error rate 25.0%" in f for f in verdicts[0].failures)
    assert any("p99 latency" in f for f in verdicts[0].failures)
    rollback = verdicts[-1].rollback
    assert rollback is not None and (rollback.state, rollback.after_version) == ("succeeded", V0)
    assert runtime.serving_version == V0
    with sqlite_db.connect() as conn:
        page = conn.execute(select(alerts).where(alerts.c.alertname == REGRESSION_ALERT)).one()
    annotations = json.loads(page.annotations)
    assert page.state == "firing" and "rolled back to " + V0 in annotations["summary"]
    assert len(json.loads(annotations["evidence"])) == 3
    # which checks failed, by name in the labels and with their figures in the annotations
    assert json.loads(page.labels)["failed_checks"] == "error_rate,p99_latency"
    assert "error rate 25.0% > 2.0% (previous 0.0%)" in annotations["failed_checks"]
    assert "p99 latency 0.400s > 1.5 x previous 0.100s" in annotations["failed_checks"]
    [check] = [c for c in verdicts[-1].failed_checks if c.check == "error_rate"]
    assert (check.value, check.limit, check.previous) == (0.25, 0.02, 0.0)
    assert analyzer.tick() == []  # the analysis is over


def _history(db: Engine, reason: str) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(select(deploys).where(deploys.c.reason == reason).order_by(deploys.c.id)))


def test_a_reason_said_before_the_rollback_reaches_the_deploy_log_is_written_with_it(
    runtime: Any, sqlite_db: Engine
) -> None:
    """The runtime posts its events off the caller's thread: whoever rolled back may say why
    before the change is in the history. The reason waits for the change (no polling) and
    goes on that one row only."""
    serve(runtime, V0)
    runtime.deploy(V1)
    deploy_log = DeployLog(sqlite_db, runtime, CollectorRegistry(), model="tiny")
    since = dt.datetime.now(dt.UTC)
    assert not deploy_log.annotate(from_version=V1, to_version=V0, reason="rollback", since=since,
                                   detail="post-deploy analysis 7 failed")  # fmt: skip
    assert _history(sqlite_db, "rollback") == []
    runtime.rollback()
    deploy_log.flush()
    [row] = _history(sqlite_db, "rollback")
    assert (row.from_version, row.to_version, row.detail) == (V1, V0, "post-deploy analysis 7 failed")
    runtime.deploy(V1)
    runtime.rollback()  # the same change again, later: nobody said why this time
    deploy_log.close()
    assert [r.detail for r in _history(sqlite_db, "rollback")] == ["post-deploy analysis 7 failed", None]


def test_healthy_deploy_passes_and_thin_traffic_is_inconclusive(
    runtime: Any, sqlite_db: Engine, tmp_path: Path
) -> None:
    serve(runtime, V0)
    clock = Clock()
    analyzer = _analyzer(sqlite_db, tmp_path, runtime, clock)
    at = clock.now
    _traffic(sqlite_db, V0, at - dt.timedelta(seconds=300), 60, errors=1, duration_s=0.1)
    analyzer.on_deploy(V1, V0, at)
    clock.advance(61)
    assert [v.verdict for v in analyzer.tick()] == ["inconclusive"]  # no traffic on the new version yet
    _traffic(sqlite_db, V1, at + dt.timedelta(seconds=62), 60, errors=1, duration_s=0.11)
    verdicts = []
    for _ in range(10):
        clock.advance(61)
        verdicts += analyzer.tick()
    assert {v.verdict for v in verdicts} == {"passed"} and all(v.rollback is None for v in verdicts)
    assert runtime.serving_version == V0  # untouched: this test never deployed V1 on the engine


def test_outcomes_the_clients_caused_never_fail_the_analysis(
    runtime: Any, sqlite_db: Engine, tmp_path: Path
) -> None:
    serve(runtime, V0)
    clock = Clock()
    analyzer = _analyzer(sqlite_db, tmp_path, runtime, clock)
    at = clock.now
    _traffic(sqlite_db, V0, at - dt.timedelta(seconds=300), 60, errors=0, duration_s=0.1)
    analyzer.on_deploy(V1, V0, at)
    # a third of the new version's requests were refused (over-long prompts) or hung up on
    _traffic(
        sqlite_db, V1, at + dt.timedelta(seconds=1), 60, errors=10, duration_s=0.1, error_type="client_error"
    )
    _traffic(
        sqlite_db, V1, at + dt.timedelta(seconds=2), 30, errors=10, duration_s=0.1, error_type="cancelled"
    )
    verdicts = []
    for _ in range(10):
        clock.advance(61)
        verdicts += analyzer.tick()
    assert {v.verdict for v in verdicts} == {"passed"} and all(v.rollback is None for v in verdicts)
    assert verdicts[0].new.error_rate == 0.0
    assert (verdicts[0].new.client_errors, verdicts[0].new.cancelled) == (10, 10)
    with sqlite_db.connect() as conn:
        assert conn.execute(select(alerts)).all() == []  # nobody paged
