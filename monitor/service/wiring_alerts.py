"""The alert engine in a started service, and the alert figures read from the store.

Wiring the alert engine (infersight.alerts) into a started service.

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
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from .errors import ConfigInvalid

if TYPE_CHECKING:
    from .service import Service

__all__ = ["AlertStoreCollector", "AlertsWiring", "ServiceSnapshotSource", "check_backups"]

log = logging.getLogger(__name__)


class ServiceSnapshotSource:
    """What a snapshot holds beyond the `requests` table."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def metrics_text(self) -> str:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.service.exposition)
        return generate_latest(registry).decode("utf-8", "replace")

    def latest_drift_report(self) -> Mapping[str, Any] | None:
        drift = self.service.parts.drift
        return drift.latest_report_json() if drift is not None else None

    def version_config(self, version: str | None) -> Mapping[str, Any] | None:
        runtime = getattr(self.service.parts.backend, "runtime", None)
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
    def __init__(self, service: Service) -> None:
        from infersight import alerts as a

        self.service = service
        cfg = service.config.alerting
        try:
            self.config = a.load_config(cfg.rules, env=os.environ)
        except a.RuleParseError as exc:
            raise ConfigInvalid("alerting.rules", str(exc)) from exc
        db = service.db
        runtime = getattr(service.parts.backend, "runtime", None)
        self.control = a.RuntimeControl(runtime) if runtime is not None else None
        self.snapshot_source = ServiceSnapshotSource(service)
        backup = service.config.engine.backup_version if service.config.engine is not None else None
        if runtime is not None:
            check_backups(self.config, getattr(runtime, "registry", None), backup)
        self.replicas = _replicas(service, self.config, runtime)
        self.runner = a.ActionRunner(db, data_dir=service.data_dir, control=self.control,
                                     snapshots=self.snapshot_source, backup_version=backup,
                                     owner=self.replicas.id if self.replicas else None,
                                     replica=self.replicas.id if self.replicas else None,
                                     targets=self.replicas)  # fmt: skip
        live = a.LiveSignals(
            self.replicas.merged if self.replicas is not None else service.parts.stats,
            gpu=service.parts.gpu,
            process=service.parts.process,
            quality=service.parts.drift,
            replica=self.replicas.id if self.replicas is not None else None,
            remote=self.replicas.remote_resources if self.replicas is not None else None,
        )
        store = a.StoreSignals(db)
        # SLOs: a ledger of good/bad requests over each SLO's window (every record, whatever fed it)
        self.slo_ledger = a.SLOLedger(self.config.slos) if self.config.slos else None
        by_kind: dict[str, Any] = {"dead_letters": store, "relevance": store}
        if self.slo_ledger is not None:
            assert service.pipeline is not None
            service.pipeline.add_observer(self.slo_ledger, every_record=True)
            service.registry.register(self.slo_ledger)
            by_kind["slo_burn_rate"] = self.slo_ledger
        self.signals = a.CompositeSignals(live, **by_kind)
        self.evaluator = a.Evaluator(db, self.config, self.signals)
        self.notifications = Counter(
            "infersight_notifications", "Notification delivery attempts", ["receiver", "outcome"],
            registry=service.registry,
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
            p99_ratio=cfg.analysis_p99_ratio,
        )  # fmt: skip
        drift = service.parts.drift
        metrics = a.StoreVersionMetrics(db, output_drift=getattr(drift, "output_drift_p_value", None))
        self.analyzer = a.DeployAnalyzer(db, metrics, self.runner, policy=policy, owner=self.runner.owner)
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
        deploy_log = self.service.parts.deploy_log
        before, after = check.rollback.before_version, check.rollback.after_version
        if deploy_log is None or before is None or after is None:
            return
        detail = f"post-deploy analysis {check.analysis_id} failed: {'; '.join(check.failures)}"
        deploy_log.annotate(from_version=before, to_version=after, reason="rollback",
                            since=check.at - dt.timedelta(seconds=1), detail=detail)  # fmt: skip

    def _snapshot_after_rollback(self, check: Any) -> None:
        """The evidence of an automatic rollback, kept for whoever is paged, and a collection
        of the requests that follow it (`alerting.collect_after_rollback`)."""
        from infersight.alerts import take_snapshot

        reason = f"automatic rollback after deploy: {'; '.join(check.failures)}"
        result = take_snapshot(
            self.service.db, data_dir=self.service.data_dir, requests_n=self.service.config.alerting.snapshot_requests,
            trigger="post_deploy", reason=reason, now=dt.datetime.now(dt.UTC),
            model_version=check.rollback.before_version, source=self.snapshot_source,
        )  # fmt: skip
        log.warning("post-deploy analysis rolled back %s; snapshot %s", check.rollback.before_version,
                    result.html_path)  # fmt: skip
        n = self.service.config.alerting.collect_after_rollback
        if n > 0:  # the incident's data: what comes next, now answered by the previous version
            from infersight.alerts import open_collection

            open_collection(
                self.service.db, collection_id=f"rollback-{check.rollback.run_id}", kind="any", n=n,
                model_version=None, reason=f"automatic rollback of {check.rollback.before_version}",
                now=dt.datetime.now(dt.UTC),
            )  # fmt: skip

    def snapshot_after_canary(self, decision: Any) -> None:
        """The evidence of a canary rollback: the rolled-back version's last requests, and a
        collection of the requests that follow it (`alerting.collect_after_rollback`)."""
        from infersight.alerts import take_snapshot

        result = take_snapshot(
            self.service.db, data_dir=self.service.data_dir, requests_n=self.service.config.alerting.snapshot_requests,
            trigger="canary", reason=f"canary rolled back: {decision.reason}", now=dt.datetime.now(dt.UTC),
            model_version=decision.version, source=self.snapshot_source,
        )  # fmt: skip
        log.warning("canary %s rolled back; snapshot %s", decision.version, result.html_path)
        n = self.service.config.alerting.collect_after_rollback
        if n > 0:  # the incident's data, as after a post-deploy rollback
            from infersight.alerts import open_collection

            open_collection(
                self.service.db, collection_id=f"canary-{decision.version}-{int(decision.at)}", kind="any", n=n,
                model_version=None, reason=f"automatic rollback of {decision.version}", now=dt.datetime.now(dt.UTC),
            )  # fmt: skip

    # -- for the routers ------------------------------------------------------------------
    def slo_summary(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.slo_ledger.statuses()] if self.slo_ledger is not None else []

    def firing_summary(self) -> list[dict[str, Any]]:
        from infersight.monitor.store.tables import alerts
        from sqlalchemy import select

        with self.service.db.connect() as conn:
            rows = conn.execute(
                select(alerts).where(alerts.c.state == "firing").order_by(alerts.c.fired_at.desc())
            ).all()
        out = []
        for r in rows:
            labels = json.loads(r.labels)
            annotations = json.loads(r.annotations)
            out.append({
                "alertname": r.alertname, "severity": labels.get("severity"),
                "summary": annotations.get("summary", ""), "active_since": _iso(r.fired_at or r.active_at),
                "labels": labels,
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


def _replicas(service: Service, config: Any, runtime: Any) -> Any:
    """This replica's share of the shared store (None without live statistics)."""
    from infersight.alerts.rules.signals import Signal

    from .replicas import Replicas

    stats = service.parts.stats
    if stats is None:
        return None
    kinds = ("latency_quantile", "error_rate", "request_rate")
    signals: list[Signal] = [r.condition.signal for g in config.groups for r in g.rules]
    windows = [s.window_s for s in signals if s.kind in kinds and s.window_s]
    return Replicas(
        service.db, stats, publish_s=service.config.schedule.publish_s, horizon_s=max(windows, default=300.0),
        serving_version=(lambda: runtime.serving_version) if runtime is not None else (lambda: None),
        gpu=service.parts.gpu, process=service.parts.process, replica_id=service.replica_id,
    )  # fmt: skip


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def wire_alerts(service: Service) -> AlertsWiring | None:
    if not service.config.alerting.enabled:
        return None
    from infersight.monitor.dataset import fill_collections

    wiring = AlertsWiring(service)
    service.parts.alerts = wiring
    # store-wide figures come from the leader alone: a sum over replicas counts them once
    service.registry.register(AlertStoreCollector(service.db, leading=service.scheduler.leader.is_leader))
    schedule = service.config.schedule
    if wiring.replicas is not None:
        service.parts.replicas = wiring.replicas
        service.scheduler.add("replicas_publish", wiring.replicas.publish, schedule.publish_s, run_now=True)
        service.scheduler.add("replicas_prune", wiring.replicas.prune, 60.0, leader_only=True)
    service.scheduler.add("replica_actions", wiring.run_own_actions, schedule.rules_s)
    service.scheduler.add("rules", wiring.evaluate, schedule.rules_s, leader_only=True)
    service.scheduler.add("outbox", wiring.dispatch, schedule.outbox_s, leader_only=True)
    service.scheduler.add("post_deploy", wiring.analyze, schedule.post_deploy_s)
    # the collect action's collections keep the requests that arrive after it ran
    service.scheduler.add("collect", lambda: fill_collections(service.db), schedule.rules_s, leader_only=True)
    deploy_log = service.parts.deploy_log
    if deploy_log is not None:
        deploy_log.listeners.append(wiring.on_version_deployed)
    return wiring


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
