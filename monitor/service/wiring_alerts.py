"""The alert engine (infersight.alerts) in a started service, and the alert figures read
from the store.

- Rules: `Evaluator` over the live statistics (`LiveSignals`: latency, errors, queue, GPU,
  memory slopes, drift p-values) and the store (`StoreSignals`: relevance of sampled
  requests, dead letters), as the leader-only job `rules`, followed by the actions it queued.
  Every replica's signals reach them (replicas.py: each publishes its windows and its
  latest GPU and process readings, the leader merges them).
- Actions on a model go to the replicas serving the alerted version (a row per replica in
  `alert_action_runs`, claimed by that replica's job `replica_actions`).
- Delivery: `Dispatcher` over the outbox, leader-only job `outbox`.
- Actions: an `ActionRunner` controlling the embedded runtime (none in proxy mode) and
  taking snapshots with what the service knows (metrics, latest drift report, version config).
  `failover` switches to the rule's `backup`, else to `engine.backup_version`; both are
  checked against the registry at start, and a failover with neither is refused at run time
  with the `RemediationFailed` alert (and a warning at start).
- Post-deploy analysis: `DeployAnalyzer`, started by each deploy the runtime reports.
- Inbound Alertmanager webhooks: the alerts package's router, mounted behind the token.

Metrics read from the shared store at scrape time: firing alerts by name and severity,
outbox backlog and dead letters. Every replica would read the same figures, so only the
leader exports them (`leading`): a dashboard's `sum()` over instances counts each once."""

from __future__ import annotations

import collections
import datetime as dt
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from .errors import ConfigInvalid
from .http_edge import json_time

if TYPE_CHECKING:
    from infersight.collectors import GPUCollector, InferenceStats, ProcessCollector

    from .config import ServiceConfig
    from .metrics import CombinedRegistry
    from .pipeline import RecordPipeline
    from .replicas import Replicas
    from .runtime_store import DeployLog
    from .wiring_drift import DriftWiring

__all__ = [
    "AlertStoreCollector",
    "AlertsWiring",
    "ServiceSnapshotSource",
    "check_backups",
    "record_canary_decision",
    "roll_back_canary",
]

log = logging.getLogger(__name__)


class ServiceSnapshotSource:
    """What a snapshot holds beyond the `requests` table."""

    def __init__(self, exposition: CombinedRegistry, drift: DriftWiring | None, runtime: Any) -> None:
        self.exposition = exposition
        self.drift = drift
        self.runtime = runtime

    def metrics_text(self) -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.exposition)
        return generate_latest(registry).decode("utf-8", "replace")

    def latest_drift_report(self) -> Mapping[str, Any] | None:
        drift = self.drift
        return drift.latest_report_json() if drift is not None else None

    def version_config(self, version: str | None) -> Mapping[str, Any] | None:
        runtime = self.runtime
        if runtime is None or version is None or version not in runtime.registry:
            return None
        info = runtime.registry.get(version)
        out: dict[str, Any] = info.to_json()
        try:
            out["config.json"] = json.loads((info.path / "config.json").read_text())
        except (OSError, ValueError):
            out["config.json"] = None
        return out


class AlertsWiring:
    """The alert engine over `db`: rules on the live statistics (`stats`, `gpu`, `process`,
    merged across replicas with a shared store) and on `drift`'s quality signals, actions on
    the embedded `runtime` (None in proxy mode), the SLO ledger fed by `pipeline`, metrics in
    `registry`, snapshots with what `exposition` exposes, deploy explanations in `deploy_log`."""

    def __init__(
        self,
        config: ServiceConfig,
        db: Engine,
        *,
        data_dir: Path,
        registry: CollectorRegistry,
        exposition: CombinedRegistry,
        pipeline: RecordPipeline,
        replica_id: str,
        stats: InferenceStats | None = None,
        gpu: GPUCollector | None = None,
        process: ProcessCollector | None = None,
        drift: DriftWiring | None = None,
        runtime: Any = None,
        deploy_log: DeployLog | None = None,
        pairs: Any = None,  # PairedEvidence: the post-deploy analysis' paired checks (None: unpaired)
    ) -> None:
        from infersight import alerts as a

        cfg = config.alerting
        self.settings = cfg
        self.db = db
        self.data_dir = data_dir
        self.deploy_log = deploy_log
        try:
            self.config = a.load_config(cfg.rules, env=os.environ)
        except a.RuleParseError as exc:
            raise ConfigInvalid("alerting.rules", str(exc)) from exc
        self.control = a.RuntimeControl(runtime) if runtime is not None else None
        self.snapshot_source = ServiceSnapshotSource(exposition, drift, runtime)
        backup = config.engine.backup_version if config.engine is not None else None
        if runtime is not None:
            check_backups(self.config, getattr(runtime, "registry", None), backup)
        self.replicas = _replicas(
            db, self.config, runtime, stats, gpu=gpu, process=process, publish_s=config.schedule.publish_s,
            replica_id=replica_id,
        )  # fmt: skip
        self.runner = a.ActionRunner(db, data_dir=data_dir, control=self.control,
                                     snapshots=self.snapshot_source, backup_version=backup,
                                     owner=self.replicas.id if self.replicas else None,
                                     replica=self.replicas.id if self.replicas else None,
                                     targets=self.replicas)  # fmt: skip
        live = a.LiveSignals(
            self.replicas.merged if self.replicas is not None else stats,
            gpu=gpu,
            process=process,
            quality=drift,
            replica=self.replicas.id if self.replicas is not None else None,
            remote=self.replicas.remote_resources if self.replicas is not None else None,
        )
        store = a.StoreSignals(db)
        # SLOs: a ledger of good/bad requests over each SLO's window (every record, whatever fed it)
        self.slo_ledger = a.SLOLedger(self.config.slos) if self.config.slos else None
        by_kind: dict[str, Any] = {"dead_letters": store, "relevance": store}
        if self.slo_ledger is not None:
            pipeline.add_observer(self.slo_ledger, every_record=True)
            registry.register(self.slo_ledger)
            by_kind["slo_burn_rate"] = self.slo_ledger
        self.signals = a.CompositeSignals(live, **by_kind)
        self.evaluator = a.Evaluator(db, self.config, self.signals)
        self.notifications = Counter(
            "infersight_notifications", "Notification delivery attempts", ["receiver", "outcome"],
            registry=registry,
        )  # fmt: skip
        for receiver in self.config.receivers:  # at 0 from the first scrape: a first page is an increase
            for outcome in ("delivered", "retried", "dead"):
                self.notifications.labels(receiver, outcome)
        self.dispatcher = a.Dispatcher(
            db, a.build_receivers(self.config.receivers), a.HttpxSender(), on_result=self._count
        )
        policy = a.AnalysisPolicy(
            window_s=cfg.analysis_window_s, interval_s=cfg.analysis_interval_s,
            max_failed_checks=cfg.analysis_failed_checks, min_requests=cfg.analysis_min_requests,
            p99_ratio=cfg.analysis_p99_ratio, max_hold_s=cfg.analysis_max_hold_s,
        )  # fmt: skip
        metrics = a.StoreVersionMetrics(db, output_drift=getattr(drift, "output_drift_p_value", None))
        self.analyzer = a.DeployAnalyzer(db, metrics, self.runner, policy=policy, owner=self.runner.owner,
                                         pairs=pairs)  # fmt: skip
        self.alertmanager = a.AlertmanagerHandler(db, self.runner)

    def _count(self, result: Any) -> None:
        if result.outcome in ("delivered", "retried", "dead"):
            self.notifications.labels(result.receiver, result.outcome).inc()

    # -- jobs ----------------------------------------------------------------------------
    def evaluate(self) -> None:
        self.evaluator.tick()
        self.runner.run_pending()

    def run_own_actions(self) -> None:
        """Every replica: the model actions fanned out to this replica's runtime."""
        self.runner.run_pending(own_only=True)

    def dispatch(self) -> None:
        while len(self.dispatcher.run_once()) >= 20:
            pass

    def on_version_deployed(self, event: Any) -> None:
        """From the deploy log (off the engine's thread): a deploy starts an analysis."""
        self.analyzer.observe(event)

    def analyze(self) -> None:
        for check in self.analyzer.tick():
            if check.rollback is not None and check.rollback.state == "succeeded":
                self._explain_rollback(check)
                self._snapshot_after_rollback(check)

    def _explain_rollback(self, check: Any) -> None:
        """The deploy history says which checks failed, with their figures."""
        deploy_log = self.deploy_log
        before, after = check.rollback.before_version, check.rollback.after_version
        if deploy_log is None or before is None or after is None:
            return
        detail = f"post-deploy analysis {check.analysis_id} failed: {'; '.join(check.failures)}"
        # after the analysed deploy, not after this check: the rollback may have been run by an
        # earlier check's key on another thread, and this check only read its outcome
        since = check.deployed_at or check.at - dt.timedelta(minutes=10)
        if not deploy_log.annotate(from_version=before, to_version=after, reason="rollback", since=since,
                                   detail=detail):  # fmt: skip
            log.info("the rollback %s -> %s is not in the deploy history yet: its reason is written "
                     "when it arrives", before, after)  # fmt: skip

    def _snapshot_after_rollback(self, check: Any) -> None:
        """The evidence of an automatic rollback, kept for whoever is paged, and a collection
        of the requests that follow it (`alerting.collect_after_rollback`)."""
        from infersight.alerts import take_snapshot

        reason = f"automatic rollback after deploy: {'; '.join(check.failures)}"
        result = take_snapshot(
            self.db, data_dir=self.data_dir, requests_n=self.settings.snapshot_requests,
            trigger="post_deploy", reason=reason, now=dt.datetime.now(dt.UTC),
            model_version=check.rollback.before_version, source=self.snapshot_source,
        )  # fmt: skip
        log.warning("post-deploy analysis rolled back %s; snapshot %s", check.rollback.before_version,
                    result.html_path)  # fmt: skip
        n = self.settings.collect_after_rollback
        if n > 0:  # the incident's data: what comes next, now answered by the previous version
            from infersight.alerts import open_collection

            open_collection(
                self.db, collection_id=f"rollback-{check.rollback.run_id}", kind="any", n=n,
                model_version=None, reason=f"automatic rollback of {check.rollback.before_version}",
                now=dt.datetime.now(dt.UTC),
            )  # fmt: skip

    def snapshot_after_canary(self, decision: Any) -> None:
        """The evidence of a canary rollback: the rolled-back version's last requests, and a
        collection of the requests that follow it (`alerting.collect_after_rollback`)."""
        from infersight.alerts import take_snapshot

        result = take_snapshot(
            self.db, data_dir=self.data_dir, requests_n=self.settings.snapshot_requests,
            trigger="canary", reason=f"canary rolled back: {decision.reason}", now=dt.datetime.now(dt.UTC),
            model_version=decision.version, source=self.snapshot_source,
        )  # fmt: skip
        log.warning("canary %s rolled back; snapshot %s", decision.version, result.html_path)
        n = self.settings.collect_after_rollback
        if n > 0:  # the incident's data, as after a post-deploy rollback
            from infersight.alerts import open_collection

            open_collection(
                self.db, collection_id=f"canary-{decision.version}-{int(decision.at)}", kind="any", n=n,
                model_version=None, reason=f"automatic rollback of {decision.version}", now=dt.datetime.now(dt.UTC),
            )  # fmt: skip

    # -- for the routers ------------------------------------------------------------------
    def slo_summary(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.slo_ledger.statuses()] if self.slo_ledger is not None else []

    def firing_summary(self) -> list[dict[str, Any]]:
        from infersight.monitor.store.tables import alerts
        from sqlalchemy import select

        with self.db.connect() as conn:
            rows = conn.execute(
                select(alerts).where(alerts.c.state == "firing").order_by(alerts.c.fired_at.desc())
            ).all()
        out = []
        for r in rows:
            labels = json.loads(r.labels)
            annotations = json.loads(r.annotations)
            out.append({
                "alertname": r.alertname, "severity": labels.get("severity"),
                "summary": annotations.get("summary", ""), "active_since": json_time(r.fired_at or r.active_at),
                "labels": labels,
                # the slowdown checklist's summary line, where the rule ran it (the diagnose action)
                "diagnosis": annotations.get("diagnosis"), "fingerprint": r.fingerprint,
            })  # fmt: skip
        return out


def check_backups(config: Any, registry: Any, backup: str | None) -> None:
    """Every version a failover may switch to is registered: `engine.backup_version` and
    each rule's `backup` (ConfigInvalid naming the key or the rule otherwise). A failover
    rule with no backup at all is only warned about: it is refused, and pages, when it runs."""
    known = (lambda v: v in registry) if registry is not None else (lambda v: True)
    if backup is not None and not known(backup):
        raise ConfigInvalid("engine.backup_version", f"{backup!r} is not a registered version")
    for rule in config.rules:
        for action in (a for a in rule.actions if a.type == "failover"):
            named = action.param("backup")
            where = f"{config.file}:{rule.line}" if rule.line is not None else config.file
            if named is not None and not known(str(named)):
                raise ConfigInvalid("alerting.rules", f"{where}: rule {rule.name}: failover backup "
                                    f"{named!r} is not a registered version")  # fmt: skip
            if named is None and backup is None:
                log.warning("%s: rule %s has a failover action but no backup version is designated "
                            "(set engine.backup_version or the action's backup): it will be refused "
                            "and raise RemediationFailed", where, rule.name)  # fmt: skip


def _replicas(
    db: Engine, config: Any, runtime: Any, stats: InferenceStats | None, *, gpu: GPUCollector | None,
    process: ProcessCollector | None, publish_s: float, replica_id: str,
) -> Replicas | None:  # fmt: skip
    """This replica's share of the shared store (None without live statistics)."""
    from infersight.alerts.rules.signals import Signal

    from .replicas import Replicas

    if stats is None:
        return None
    kinds = ("latency_quantile", "error_rate", "request_rate")
    signals: list[Signal] = [r.condition.signal for g in config.groups for r in g.rules]
    windows = [s.window_s for s in signals if s.kind in kinds and s.window_s]
    return Replicas(
        db, stats, publish_s=publish_s, horizon_s=max(windows, default=300.0),
        serving_version=(lambda: runtime.serving_version) if runtime is not None else (lambda: None),
        gpu=gpu, process=process, replica_id=replica_id,
    )  # fmt: skip


class AlertStoreCollector(Collector):
    def __init__(self, db: Engine, *, leading: Callable[[], bool] = lambda: True) -> None:
        self.db = db
        self.leading = leading

    def collect(self) -> Iterator[Metric]:
        from infersight.monitor.store.tables import alerts, outbox

        if not self.leading():
            return

        firing = GaugeMetricFamily(
            "infersight_alerts_firing", "Alerts firing now", labels=["alertname", "severity"]
        )
        pending = GaugeMetricFamily("infersight_outbox_pending", "Notifications waiting to be delivered")
        dead = GaugeMetricFamily(
            "infersight_outbox_dead_letters", "Notifications that exhausted their retries"
        )
        try:
            with self.db.connect() as conn:
                rows = conn.execute(
                    select(alerts.c.alertname, alerts.c.labels).where(alerts.c.state == "firing")
                ).all()
                states: dict[str, int] = dict(
                    conn.execute(select(outbox.c.state, func.count()).group_by(outbox.c.state)).all()
                )
        except SQLAlchemyError as exc:  # a scrape never fails because the database is away
            log.warning("alert metrics unavailable: %s", exc)
            return
        counts = collections.Counter(
            (name, str(json.loads(labels).get("severity", ""))) for name, labels in rows
        )
        for (name, severity), n in sorted(counts.items()):
            firing.add_metric([name, severity], n)
        pending.add_metric([], states.get("pending", 0))
        dead.add_metric([], states.get("dead", 0))
        yield firing
        yield pending
        yield dead


def record_canary_decision(
    db: Engine, decision: Any, *, deploy_log: DeployLog | None, alerts: AlertsWiring | None
) -> None:
    """Every decision goes to the log and the deploy log; a rollback raises the
    `CanaryRegression` alert with the check and its figures (notified like any alert)
    FIRST: `roll_back_canary` then performs it and says on the same alert what it did."""
    log.warning("canary %s beside %s: %s (weight now %.0f%%): %s", decision.version, decision.stable_version,
                decision.action, decision.weight * 100, decision.reason)  # fmt: skip
    if deploy_log is not None:
        deploy_log.flush()
    if decision.action == "rollback":
        _canary_page(db, decision, "rolling back to the stable version")


def _canary_page(db: Engine, decision: Any, done: str) -> None:
    from infersight.alerts import CANARY_ALERT
    from infersight.alerts.lifecycle import push_alert

    now = dt.datetime.now(dt.UTC)
    share = decision.canary_requests / max(1, decision.canary_requests + decision.stable_requests)
    try:
        with db.begin() as conn:
            push_alert(
                conn, CANARY_ALERT,
                {"severity": "critical", "model_version": decision.version, "previous_version": decision.stable_version},
                {"summary": f"canary {decision.version} regressed against {decision.stable_version}: "
                            f"{decision.reason}; it served {share:.1%} of requests; {done}",
                 "runbook_url": "https://runbooks.example.org/infersight#canary-regression"},
                now=now, ends_at=now + dt.timedelta(hours=1),
            )  # fmt: skip
    except Exception:  # the rollback goes on; a store outage must not hide it from the log
        log.exception("canary %s: could not record the CanaryRegression alert", decision.version)


def roll_back_canary(
    db: Engine, decision: Any, canary: Any, *, deploy_log: DeployLog | None, alerts: AlertsWiring | None
) -> None:
    """Perform a canary's rollback decision after its alert: through the action runner with
    alerting on (one run per canary, keyed by when it started; recorded, verified, paged on
    failure like every action), else by `canary.abort` (the runtime's canary control); then
    the alert says what happened, the deploy log is flushed and the snapshot taken."""
    from infersight.alerts import CANARY_ALERT
    from infersight.alerts.release.post_deploy import rollback_done
    from infersight.alerts.rules.rules import ActionSpec

    message = f"canary rolled back: {decision.reason}"
    if alerts is not None and alerts.control is not None:
        started = int(decision.started_at or decision.at)  # the canary's episode: one rollback
        labels = {"model_version": decision.version}
        if alerts.runner.replica is not None:  # this replica's canary: no other replica acts
            labels["replica"] = alerts.runner.replica
        spec = ActionSpec("rollback", params=(("canary", decision.version), ("reason", message)),
                          cooldown_s=0.0, daily_cap=1_000_000)  # ending a canary never waits: stable serves  # fmt: skip
        outcome = alerts.runner.run(spec, trigger="canary", key=f"canary-{decision.version}-{started}",
                                    alertname=CANARY_ALERT, labels=labels)  # fmt: skip
        done = "rolled back" if outcome.state == "succeeded" else rollback_done(outcome)
    else:
        canary.abort(message)
        done = "rolled back"
    _canary_page(db, decision, done)
    if deploy_log is not None:
        deploy_log.flush()
    if alerts is not None:
        try:
            alerts.snapshot_after_canary(decision)
        except Exception:
            log.exception("canary %s: no snapshot at the rollback", decision.version)
