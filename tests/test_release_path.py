"""One outcome vocabulary and one path from a verdict to its action.

- Every engine error class maps to exactly one outcome (monitor/outcomes.py), and requests
  admission control refused are no release's server errors: one tenant bursting on a good
  canary's arm fills the canary's queue and nothing rolls back or pages, while a canary
  whose replica really fails is still rolled back.
- The three sources of a rollback (a rule, the post-deploy analysis, the canary) raise their
  alert first, then the action runner acts once, and one page goes out.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _engine_serving_support as support
import pytest
from infersight.alerts import ActionRunner, AnalysisPolicy, DeployAnalyzer, Evaluator, RuntimeControl
from infersight.alerts.release.canary import CANARY_ALERT, CanaryController, CanaryPolicy
from infersight.alerts.release.post_deploy import REGRESSION_ALERT, StoreVersionMetrics
from infersight.alerts.rules.config import parse_config
from infersight.alerts.rules.signals import StaticSignals
from infersight.engine import errors as engine_errors
from infersight.engine.events import RequestFailed, RequestFinished, RequestStarted
from infersight.monitor.outcomes import (
    ENGINE_OUTCOMES,
    Outcome,
    engine_error_classes,
    engine_label,
    engine_outcome,
    is_server_error,
    outcome_of,
)
from infersight.monitor.service.wiring_alerts import record_canary_decision, roll_back_canary
from infersight.monitor.store.tables import action_runs, alerts, outbox, requests
from sqlalchemy import Engine, insert, select
from test_alerts_support import WHSEC, Clock, database

STABLE, CANARY = "m_d_fp32-v1.0", "m_d_int8-v1.1"
RECEIVERS = (
    f"receivers:\n  - name: hook\n    webhook: {{url: 'http://127.0.0.1:9/', secret: '{WHSEC}'}}\n"
    "route: {receiver: hook, group_wait: 0s}\n"
)


# -- one outcome vocabulary ---------------------------------------------------------------


def test_every_engine_error_class_maps_to_exactly_one_outcome() -> None:
    classes = set(engine_error_classes())
    defined = {c for _, c in inspect.getmembers(engine_errors, inspect.isclass) if issubclass(c, Exception)}
    assert defined <= classes  # every error the engine defines is covered
    for cls in classes:
        # the nearest entries of the table along the MRO: one outcome, however the class inherits
        nearest = [b for b in cls.__mro__ if b in ENGINE_OUTCOMES]
        assert nearest, cls
        first = nearest[0]
        rivals = [b for b in nearest[1:] if not issubclass(first, b)]
        assert not rivals, (cls, rivals)
        assert isinstance(engine_outcome(cls), Outcome)
        # the event's class name reads back to the same outcome
        assert outcome_of(engine_label(cls.__name__)) is engine_outcome(cls), cls
    assert engine_outcome(engine_errors.QueueFull) is Outcome.REFUSED
    assert engine_outcome(engine_errors.PathOverloaded) is Outcome.REFUSED
    assert engine_outcome(engine_errors.PromptTooLong) is Outcome.CLIENT_ERROR
    assert engine_outcome(engine_errors.InvalidRequest) is Outcome.CLIENT_ERROR
    assert engine_outcome(engine_errors.GenerationFailed) is Outcome.SERVER_ERROR
    assert (engine_label("QueueFull"), engine_label("PathOverloaded")) == ("overloaded", "shed")
    assert engine_label("RuntimeError") == "RuntimeError" and is_server_error("RuntimeError")
    assert not is_server_error("overloaded") and not is_server_error("shed") and not is_server_error(None)


class _Canary:
    """`Runtime.canary`'s control as the controller sees it; `abort` can look at the store
    first (the alert must already be there)."""

    def __init__(self, on_abort: Any = None) -> None:
        self.status: Any = SimpleNamespace(
            version=CANARY, stable_version=STABLE, started_at=1000.0, weight=0.5
        )
        self.calls: list[tuple[str, Any]] = []
        self.on_abort = on_abort
        self.done = threading.Event()

    def set_weight(self, weight: float) -> None:
        self.calls.append(("weight", weight))

    def promote(self, message: str = "") -> None:
        self.calls.append(("promote", message))
        self.done.set()

    def abort(self, message: str = "") -> None:
        if self.on_abort is not None:
            self.on_abort()
        self.calls.append(("abort", message))
        self.status = None
        self.done.set()


def _burst(controller: CanaryController, *, canary_failure: str | None, rng: random.Random) -> None:
    """A good stable version and a canary at 50%: 40 users of each arm, requests running side by
    side; one tenant bursting as users that land on the canary, every one refused by the
    canary's full queue (QueueFull); `canary_failure`: the canary's replica also fails a
    third of its own requests with that error."""
    for i in range(600):
        for version in (STABLE, CANARY):
            rid = f"{version}-{i}"
            controller.on_event(RequestStarted(rid, version, 0.0, 0.0))
        for arm, version in ((False, STABLE), (True, CANARY)):
            rid = f"{version}-{i}"
            if arm and canary_failure is not None and rng.random() < 0.33:
                controller.on_event(RequestFailed(rid, version, 1.0, canary_failure, "boom"))
                continue
            duration = rng.uniform(0.2, 0.3)
            controller.on_event(RequestFinished(rid, version, 1.0, 8, 16, 0.0, 0.05, duration, "length"))
        for j in range(20):  # the burst: refused at submit, never ran
            controller.on_event(RequestFailed(f"burst-{i}-{j}", CANARY, 1.0, "QueueFull", "overloaded"))


def test_a_burst_filling_a_good_canarys_queue_does_not_roll_it_back() -> None:
    control = _Canary()
    decided: list[Any] = []
    controller = CanaryController(
        control, CanaryPolicy(requests_per_step=100_000), on_decision=decided.append
    )
    controller.begin(CANARY, STABLE, 0.5)
    _burst(controller, canary_failure=None, rng=random.Random(1))
    assert controller.analysis is not None
    errors = next(c for c in controller.analysis.checks() if c.name == "server_errors")
    assert (errors.canary_n, errors.stable_n) == (600, 600) and errors.canary == 0.0  # refusals not counted
    assert controller.analysis.verdict().action == "continue"
    assert not control.done.wait(0.3) and decided == [] and control.calls == []


def test_a_canary_whose_replica_fails_is_still_rolled_back_in_the_same_burst() -> None:
    control = _Canary()
    controller = CanaryController(control, CanaryPolicy(requests_per_step=100_000))
    controller.begin(CANARY, STABLE, 0.5)
    _burst(controller, canary_failure="GenerationFailed", rng=random.Random(2))
    assert control.done.wait(10)
    assert control.calls[0][0] == "abort" and "server_errors" in control.calls[0][1]


# -- one path from a verdict to its action --------------------------------------------------


@pytest.fixture
def db(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    with database("sqlite", tmp_path, request) as engine:
        yield engine


def _firing(db: Engine, alertname: str) -> list[Any]:
    with db.connect() as conn:
        return conn.execute(
            select(alerts).where(alerts.c.alertname == alertname, alerts.c.state == "firing")
        ).all()


def _pages(db: Engine, clock: Clock, alertname: str) -> list[Any]:
    """Route and notify what fired (a webhook receiver), then the notifications of `alertname`."""
    Evaluator(db, parse_config("groups: []\n" + RECEIVERS), StaticSignals(), clock=clock).tick()
    with db.connect() as conn:
        notes = [json.loads(r.payload) for r in conn.execute(select(outbox))]
    return [n for n in notes if any(a["labels"]["alertname"] == alertname for a in n["alerts"])]


class _Model:
    """A `ModelControl` (and a runtime with a canary) that records, at each action, whether
    `alertname`'s alert was already firing in the store."""

    def __init__(self, db: Engine, alertname: str, serving: str = CANARY) -> None:
        self.db, self.alertname, self.serving = db, alertname, serving
        self.actions: list[tuple[str, bool]] = []
        self.canary = _Canary(on_abort=lambda: self._saw("abort_canary"))

    def _saw(self, action: str) -> None:
        self.actions.append((action, bool(_firing(self.db, self.alertname))))

    @property
    def serving_version(self) -> str:
        return self.serving

    def deploy(self, version: str) -> None:
        self.serving = version

    def rollback(self) -> None:
        self._saw("rollback")
        self.serving = STABLE

    def failover(self, version: str) -> None:
        self.serving = version


def _runs(db: Engine) -> list[Any]:
    with db.connect() as conn:
        return conn.execute(select(action_runs)).all()


def test_a_rule_raises_its_alert_before_the_runner_rolls_back_once_and_pages_once(
    db: Engine, tmp_path: Path
) -> None:
    clock, signals = Clock(), StaticSignals()
    model = _Model(db, "ErrorSpike")
    config = parse_config(
        "groups:\n  - name: g\n    rules:\n      - alert: ErrorSpike\n        signal: {kind: drift_p_value, field: prompt}\n"
        "        op: '<'\n        threshold: 0.01\n        actions: [{type: rollback}]\n" + RECEIVERS
    )
    ev = Evaluator(db, config, signals, clock=clock)
    signals.set("drift_p_value", 0.001, model_version=CANARY)
    r = ActionRunner(db, data_dir=tmp_path, control=RuntimeControl(model), clock=clock)
    for _ in range(3):
        ev.tick()
        clock.advance(15)
        r.run_pending()
    assert model.actions == [("rollback", True)]  # one action, the alert already firing
    (run,) = _runs(db)
    assert (run.state, run.trigger, run.alertname) == ("succeeded", "rule", "ErrorSpike")
    assert len(_pages(db, clock, "ErrorSpike")) == 1


def test_the_post_deploy_analysis_pages_first_then_the_runner_rolls_back_once(
    db: Engine, tmp_path: Path
) -> None:
    clock = Clock()
    model = _Model(db, REGRESSION_ALERT)
    r = ActionRunner(db, data_dir=tmp_path, control=RuntimeControl(model), clock=clock)
    policy = AnalysisPolicy(window_s=600, interval_s=60, baseline_s=600, max_failed_checks=2, min_requests=20)
    analyzer = DeployAnalyzer(db, StoreVersionMetrics(db), r, policy=policy, clock=clock)
    at = clock.now
    rows = [
        {"request_id": f"{v}-{i}", "model": "m", "model_version": v, "source": "engine", "duration_s": 0.1,
         "started_at": at + dt.timedelta(seconds=(i + 1) * sign), "error_type": "GenerationFailed" if bad else None}
        for v, sign, rate in ((STABLE, -1, 0), (CANARY, 1, 3))
        for i in range(60)
        for bad in [rate and i % rate == 0]
    ]  # fmt: skip
    with db.begin() as conn:
        conn.execute(insert(requests), rows)
    analyzer.on_deploy(CANARY, STABLE, at)
    results = []
    for _ in range(4):
        clock.advance(61)
        results += analyzer.tick()
    assert [c.verdict for c in results][:2] == ["failed", "failed"]
    assert model.actions == [("rollback", True)]  # one action, the page already firing
    (run,) = _runs(db)
    assert (run.state, run.trigger, run.alertname) == ("succeeded", "analysis", REGRESSION_ALERT)
    (page,) = _firing(db, REGRESSION_ALERT)
    assert "rolled back to " + STABLE in json.loads(page.annotations)["summary"]  # the same page, updated
    assert len(_pages(db, clock, REGRESSION_ALERT)) == 1


def test_the_canary_pages_first_then_the_runner_ends_it_once(db: Engine, tmp_path: Path) -> None:
    clock = Clock(time.time())  # the service's canary page is stamped by the wall clock
    model = _Model(db, CANARY_ALERT, serving=STABLE)
    control = RuntimeControl(model)
    wiring = SimpleNamespace(
        control=control,
        runner=ActionRunner(db, data_dir=tmp_path, control=control, clock=clock),
        snapshot_after_canary=lambda decision: None,
    )
    controller = CanaryController(
        model.canary,
        CanaryPolicy(requests_per_step=100_000),
        on_decision=lambda d: record_canary_decision(db, d, deploy_log=None, alerts=wiring),  # type: ignore[arg-type]
        rollback=lambda d: roll_back_canary(db, d, model.canary, deploy_log=None, alerts=wiring),  # type: ignore[arg-type]
    )
    controller.begin(CANARY, STABLE, 0.5)
    _burst(controller, canary_failure="GenerationFailed", rng=random.Random(3))
    assert model.canary.done.wait(10)
    for _ in range(1000):  # the runner records the run once the abort returned
        if _runs(db)[0].state != "pending" and _firing(db, CANARY_ALERT)[0].annotations.endswith(
            'rolled back"}'
        ):
            break
        threading.Event().wait(0.01)
    assert model.actions == [("abort_canary", True)]  # one action, the page already firing
    assert model.canary.calls[0][0] == "abort" and model.canary.calls[0][1].startswith("canary rolled back: ")
    (run,) = _runs(db)
    assert (run.state, run.trigger, run.alertname) == ("succeeded", "canary", CANARY_ALERT)
    assert json.loads(run.detail)["canary"] == CANARY
    # the same decision again (a retry, another thread): the runner's key, no second action
    (decision,) = controller.decisions
    roll_back_canary(db, decision, model.canary, deploy_log=None, alerts=wiring)  # type: ignore[arg-type]
    assert len(_runs(db)) == 1 and len(model.actions) == 1
    (page,) = _firing(db, CANARY_ALERT)
    assert "server_errors" in json.loads(page.annotations)["summary"]
    assert json.loads(page.annotations)["summary"].endswith("rolled back")
    assert len(_pages(db, clock, CANARY_ALERT)) == 1


# -- the burst on the real runtime ----------------------------------------------------------

tiny_checkpoints, registry = support.tiny_checkpoints, support.registry  # fixtures


def test_on_the_real_runtime_a_tenants_burst_on_a_good_canary_is_refused_first_and_not_rolled_back(
    registry: Any,
) -> None:
    from infersight.engine.admission import AdmissionLimits
    from infersight.engine.errors import QueueFull
    from infersight.engine.runtime import Runtime
    from infersight.engine.runtime_canary import user_bucket

    rt = Runtime(registry, max_batch_size=2, max_prompt_tokens=32, max_seq_len=64,
                 admission=AdmissionLimits(max_queue=8))  # fmt: skip
    rt.start(support.V1)
    try:
        rt.canary.start(support.V2, 0.5)
        controller = CanaryController(rt.canary, CanaryPolicy(requests_per_step=100_000, min_requests=2))
        controller.begin(support.V2, support.V1, 0.5)
        unsubscribe = rt.subscribe(controller.on_event)
        on_canary = [u for u in (f"user-{i}" for i in range(200)) if user_bucket(u, support.V2) < 0.5]
        tenant, others = on_canary[0], on_canary[1:4]
        handles, refused = [], 0
        for i in range(24):  # the tenant's burst, all at once, every one landing on the canary
            try:
                handles.append(rt.submit(support.prompt(i, 8), max_new_tokens=40, user=tenant))
            except QueueFull as exc:
                refused += 1
                assert "fair share" in str(exc) or "max_queue" in str(exc)
        # the other users behind the burst still find room: the tenant holds at most half the queue
        handles += [
            rt.submit(support.prompt(100 + i, 8), max_new_tokens=4, user=u) for i, u in enumerate(others)
        ]
        for h in handles:
            h.result(120)
        # refused first by its share of the queue, before the queue itself was full
        assert refused > 0 and rt.admission.refused_over_share.get("canary") == refused
        for _ in range(500):  # the controller has seen every finished request
            if controller.served[True] >= len(handles):
                break
            threading.Event().wait(0.01)
        unsubscribe()
        assert controller.analysis is not None and rt.canary.status is not None  # still running
        errors = next(c for c in controller.analysis.checks() if c.name == "server_errors")
        assert errors.canary == 0.0 and controller.decisions == []  # the refusals are no server errors
    finally:
        rt.stop(drain=False)
