"""The composition root. `Service` owns the database, the metrics registry, the record
pipeline, the scheduler and whatever serves `/v1` (embedded runtime or upstream proxy),
and wires the collectors (live statistics, GPU and process samplers), the `/v1` backend,
drift and alerts to them (`_wire`). Each part is kept in `service.parts` under its typed
name, where the routers read it, and is handed what it uses as typed parameters: no part
holds the Service. Nothing here is module-level state: two services in one process
(tests) share nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from infersight.monitor.records import RecordLimits
from infersight.monitor.store import connect, current_revision, head_revision, sqlite_url, upgrade
from infersight.monitor.store.retention import enforce_retention, prune_snapshot_files
from infersight.monitor.store.writer import RequestWriter
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from .config import ServiceConfig, is_loopback
from .data_dir import narrow_data_dir
from .errors import ConfigInvalid, InsecureBind
from .http_edge import load_or_create_token
from .jobs import (
    LeaderLock,
    ServiceScheduler,
    freeze_heap,
    leader_lock_for,
    limit_malloc_arenas,
    new_replica_id,
    thaw_heap,
    trim_heap,
)
from .metrics import CombinedRegistry, ServiceMetrics, Timeseries, timeseries_point
from .pipeline import RecordPipeline, TextReservoir

if TYPE_CHECKING:
    from infersight.collectors import GPUCollector, InferenceStats, ProcessCollector
    from infersight.monitor.drift import DriftDetector

    from .backend_engine import EngineBackend
    from .backend_proxy import ProxyBackend, UpstreamQueueScraper
    from .metrics import CostMeter
    from .release_verdicts import ReleaseVerdicts
    from .replicas import Replicas
    from .runtime_store import DeployLog
    from .sla_routing import RouteMetrics
    from .wiring_alerts import AlertsWiring
    from .wiring_business import BusinessWiring
    from .wiring_drift import DriftWiring

__all__ = ["Parts", "Service"]


@dataclass
class Parts:
    """The parts `_wire` puts into a started service, each under its own typed name;
    None until wired, or when the configuration leaves the part out."""

    stats: InferenceStats | None = None  # the live statistics (collectors)
    gpu: GPUCollector | None = None
    process: ProcessCollector | None = None
    cost: CostMeter | None = None  # with `cost:` only
    backend: EngineBackend | ProxyBackend | None = None  # the /v1 backend
    deploy_log: DeployLog | None = None  # embedded runtime only
    routing: RouteMetrics | None = None  # embedded runtime with `routing:` only
    upstream_metrics: UpstreamQueueScraper | None = None  # proxy mode only
    drift: DriftWiring | None = None
    drift_detector: DriftDetector | None = None  # set before start() to score with this detector
    alerts: AlertsWiring | None = None
    replicas: Replicas | None = None  # with a shared (PostgreSQL) store
    verdicts: ReleaseVerdicts | None = None  # the release verdicts the paired checks keep current
    business: BusinessWiring | None = None  # feedback, satisfaction, environment, diagnosis


log = logging.getLogger(__name__)


class Service:
    """Build with a config; `start()` migrates the store and starts the jobs; `stop()`."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        runtime: Any = None,
        upstream_transport: Any = None,
        nvml: Any = None,
        leader: LeaderLock | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not is_loopback(config.host) and not config.token:
            raise InsecureBind(config.host)
        self.config = config
        self.clock = clock
        self.data_dir = Path(config.data_dir).expanduser().resolve()
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds users' text
        # what an older version (or a umask of 0022) left open is narrowed, an exposed token rotated
        narrow_data_dir(self.data_dir, token_from_file=not config.token)
        self.token = config.token or load_or_create_token(self.data_dir)
        # what one call can be: events and spans past it are refused by field
        self.record_limits = RecordLimits(config.limits.max_duration_s, config.limits.max_tokens)
        self.database_url = config.database_url or sqlite_url(self.data_dir)
        self.db: Engine = connect(self.database_url)
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics = ServiceMetrics(self.registry)
        self.exposition = CombinedRegistry([self.registry])
        # texts wait here for the drift `embed` job; none are kept when drift is off
        self.reservoir: TextReservoir | None = (
            TextReservoir(config.drift.reservoir, on_skip=self.metrics.texts_skipped.inc)
            if config.drift.enabled
            else None
        )
        self.writer: RequestWriter | None = None
        self.pipeline: RecordPipeline | None = None
        self.timeseries = Timeseries(config.limits.timeseries_points)
        self.scheduler = ServiceScheduler(
            self.metrics, leader or leader_lock_for(self.db, enabled=config.leader_election)
        )
        self._runtime_seam = runtime
        self._upstream_transport = upstream_transport
        self._nvml_seam = nvml  # the pynvml module or a stand-in (None: import pynvml)
        self.parts = Parts()  # the wired parts, typed (`_wire` below)
        self.replica_id = new_replica_id()  # this process among the replicas on one database
        self.started_at: float | None = None
        self._started_mono: float | None = None
        self.schema_revision: str | None = None
        self.redactor: Callable[[str], str] | None = None  # config.redact, resolved at start
        self._gc_threshold: tuple[int, int, int] | None = None  # the process's, while started

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        limit_malloc_arenas()  # before the service's threads exist: see jobs.py
        self.schema_revision = upgrade(self.db)
        if self.config.redact is not None:
            from infersight.monitor.dataset import RedactorInvalid, load_redactor

            try:
                self.redactor = load_redactor(self.config.redact)
            except RedactorInvalid as exc:
                raise ConfigInvalid("redact", str(exc)) from exc
        self.writer = RequestWriter(
            self.db,
            max_queued_rows=self.config.limits.write_queue_rows,
            on_written=self.metrics.store_rows_written.inc,
            on_error=lambda exc: self.metrics.store_write_errors.inc(),
        )
        self.pipeline = RecordPipeline(self.writer, self.metrics, reservoir=self.reservoir)
        _wire(self)
        snapshot_dir = self.data_dir / "snapshots"
        self.scheduler.add(
            "retention",
            lambda: enforce_retention(self.db, self.config.retention, snapshot_dir=snapshot_dir),
            self.config.schedule.retention_s,
            leader_only=True,
        )
        # every replica's own snapshot files go after their rows (the leader deletes rows)
        self.scheduler.add(
            "snapshot_files",
            lambda: prune_snapshot_files(self.db, snapshot_dir),
            self.config.schedule.retention_s,
        )
        self.scheduler.add("trim_heap", trim_heap, 30.0)
        self.scheduler.start()
        self._gc_threshold = freeze_heap()  # see jobs.py: start-up's objects out of the collector's runs
        self.started_at = self.clock()
        self._started_mono = time.monotonic()
        log.info("infersight service started (schema %s, database %s)", self.schema_revision,
                 self.db.url.render_as_string(hide_password=True))  # fmt: skip

    def stop(self) -> None:
        """Stop the jobs, the backend and the writer (everything queued is written). Idempotent."""
        if self.started_at is None and self.writer is None:
            return
        self.started_at = None
        self.scheduler.shutdown(wait=True)
        _unwire(self)
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.db.dispose()
        thaw_heap(self._gc_threshold)
        self._gc_threshold = None

    @property
    def started(self) -> bool:
        return self.started_at is not None

    # -- state the routers read ------------------------------------------------------
    @property
    def uptime_s(self) -> float:
        return 0.0 if self._started_mono is None else time.monotonic() - self._started_mono

    def readiness(self) -> dict[str, str]:
        """Each check's problem; empty when ready."""
        problems: dict[str, str] = {}
        try:
            with self.db.connect() as conn:
                conn.execute(text("SELECT 1"))
            if current_revision(self.db) != head_revision():
                problems["database"] = "schema is not at the newest revision"
        except Exception as exc:  # any failure to reach the database means not ready
            problems["database"] = f"unreachable: {type(exc).__name__}"
        if self.pipeline is None or not self.scheduler.running:
            problems["service"] = "not started"
        backend = self.parts.backend
        if backend is not None:
            why = backend.not_ready()
            if why:
                problems["backend"] = why
        return problems


# -- wiring: each part gets what it uses, and is kept in `service.parts` ------------------
def _wire(service: Service) -> None:
    _wire_collectors(service)
    _wire_backend(service)
    _wire_verdicts(service)
    _wire_drift(service)
    _wire_alerts(service)
    _wire_business(service)
    schedule = service.config.schedule
    service.scheduler.add("timeseries", lambda: _sample_timeseries(service), schedule.timeseries_s)


def _wire_business(service: Service) -> None:
    from .wiring_business import BusinessWiring, StepTimeHistory

    parts, config = service.parts, service.config
    gpu = parts.gpu
    # the embedded engine's measured steps (a proxy backend has no runtime)
    step_times = getattr(getattr(parts.backend, "runtime", None), "step_times", None)
    steps = StepTimeHistory(step_times, tick_s=config.schedule.timeseries_s) if callable(step_times) else None
    business = BusinessWiring(
        service.db, clock=service.clock, feedback_ttl_s=config.feedback_ttl_s,
        long_prompt_tokens=config.long_prompt_tokens, replica=service.replica_id,
        readings=lambda seconds: service.timeseries.window(seconds, now=service.clock()),
        cuda_driver=getattr(gpu, "driver_version", None), steps=steps,
    )  # fmt: skip
    parts.business = business
    service.registry.register(business.metrics)
    business.record_environment("start")
    if parts.deploy_log is not None:
        parts.deploy_log.listeners.append(business.on_deploy_event)
    if parts.alerts is not None:
        parts.alerts.runner.diagnoser = business
    service.scheduler.add("satisfaction", business.refresh, 300.0, leader_only=True, run_now=True)


def _sample_timeseries(service: Service) -> None:
    schedule, parts = service.config.schedule, service.parts
    point = timeseries_point(
        parts.stats,
        parts.gpu,
        parts.process,
        window_s=schedule.timeseries_window_s,
        tick_s=schedule.timeseries_s,
    )
    now = service.clock()
    service.timeseries.append(now, point)
    business = parts.business
    if business is not None and business.steps is not None:  # the step check's baseline needs history
        business.steps.sample(now)


def _unwire(service: Service) -> None:
    parts = service.parts
    replicas, parts.replicas = parts.replicas, None
    if replicas is not None:
        try:
            replicas.withdraw()
        except Exception as exc:  # the database may be gone; the heartbeat then just goes stale
            log.warning("could not withdraw replica %s: %s", replicas.id, exc)
    deploy_log, parts.deploy_log = parts.deploy_log, None
    if deploy_log is not None:
        deploy_log.close()
    backend, parts.backend = parts.backend, None
    if backend is not None:
        backend.close()
    collectors = (parts.gpu, parts.process, parts.upstream_metrics)
    parts.gpu = parts.process = parts.upstream_metrics = None
    for collector in collectors:
        close = getattr(collector, "close", None) or getattr(collector, "stop", None)
        if close is not None:
            close()


def _wire_collectors(service: Service) -> None:
    from infersight.collectors import GPUCollector, InferenceStats, ProcessCollector

    stats = InferenceStats(service.registry, max_label_values=service.config.limits.max_label_values)
    service.parts.stats = stats
    assert service.pipeline is not None
    service.pipeline.add_observer(stats)
    service.pipeline.label_set = stats.label_set  # drift's per-version state is capped alike
    pid = service.config.supervise_pid  # None: this process (the server, with the embedded runtime)
    if pid is None and service.config.upstream is not None:
        log.warning("proxy mode without supervise_pid: the process collector watches the sidecar itself, "
                    "not the inference server (give --supervise-pid)")  # fmt: skip
    try:
        process = ProcessCollector(service.registry, pid=pid)
    except psutil.Error as exc:
        raise ConfigInvalid("supervise_pid", f"cannot watch process {pid}: {type(exc).__name__}") from exc
    gpu = GPUCollector(service.registry, nvml=service._nvml_seam, pid=pid)
    service.parts.gpu = gpu
    service.parts.process = process
    if service.config.cost is not None:
        from .metrics import CostMeter

        cost = service.config.cost
        devices = (lambda: len(gpu.latest()) if gpu.enabled else 1) if cost.per == "device" else (lambda: 1)
        meter = CostMeter(cost.per_hour, devices=devices, window_s=cost.window_s, label_set=stats.label_set)
        service.parts.cost = meter
        service.registry.register(meter)
        service.pipeline.add_observer(meter, every_record=True)

    def sample() -> None:  # on the scheduler, not on threads of their own
        if gpu.enabled:
            gpu.sample_once()
        process.sample_once()

    sample()
    service.scheduler.add("sample_collectors", sample, service.config.schedule.sample_s)


def _wire_backend(service: Service) -> None:
    config = service.config
    if config.upstream is not None:
        from .backend_proxy import ProxyBackend

        assert service.pipeline is not None
        proxy = ProxyBackend(
            config.upstream, pipeline=service.pipeline, metrics=service.metrics,
            text_sample_rate=config.text_sample_rate, transport=service._upstream_transport,
            shadow=_proxy_shadow(service),
        )  # fmt: skip
        service.parts.backend = proxy
        if proxy.pair_feed is not None:  # scored on the embedder's beat (drift wiring sets it)
            service.scheduler.add("pairs", proxy.pair_feed.score, config.schedule.embed_s)
        _wire_upstream_metrics(service)
    elif config.engine is not None or service._runtime_seam is not None:
        from .backend_engine import EngineBackend
        from .runtime_store import DeployLog

        assert service.pipeline is not None
        parts = service.parts
        backend = EngineBackend.start(
            config, service.db, pipeline=service.pipeline, exposition=service.exposition,
            runtime=service._runtime_seam, on_canary_decision=lambda decision: _canary_decided(service, decision),
            on_canary_rollback=lambda decision: _canary_rollback(service, decision),
        )  # fmt: skip
        parts.backend = backend
        backend.observe_events(parts.stats)
        parts.routing = backend.route_metrics
        deploy_log = DeployLog(
            service.db,
            backend.runtime,
            service.registry,
            model=backend.model_name,
            replica=service.replica_id,
        )
        service.parts.deploy_log = deploy_log
        backend.resume_canary()
        if backend.pair_feed is not None:  # scored on the embedder's beat (drift wiring sets it)
            service.scheduler.add("pairs", backend.pair_feed.score, config.schedule.embed_s)
        deploy_log.flush()
        service.scheduler.add("deploy_log", deploy_log.flush, 1.0)


def _proxy_shadow(service: Service) -> Any:
    """Proxy mode's pairs: the shadow upstream (proxy_shadow.py) and its pair feed, its
    counts in `infersight_shadow_requests_total`; None without `shadow_upstream:`."""
    config = service.config
    if config.shadow_upstream is None:
        return None
    from infersight.alerts.release.paired_checks import PairedEvidence

    from .pair_feed import PairFeed
    from .proxy_shadow import ProxyShadow, ProxyShadowCollector

    shadow_cfg = config.shadow_upstream
    evidence = PairedEvidence(
        enabled=shadow_cfg.share > 0.0, off_reason="paired checks off: shadow_upstream.share is 0"
    )
    shadow = ProxyShadow(shadow_cfg, PairFeed(None, evidence), transport=service._upstream_transport)
    assert config.upstream is not None
    model = config.model or config.upstream.model or "unknown"
    service.registry.register(ProxyShadowCollector(shadow, model=model))
    return shadow


def _wire_verdicts(service: Service) -> None:
    """The release verdicts (release_verdicts.py), kept current by the backend's pair evidence,
    and their series; without pairs, verdicts that say why none can be judged."""
    from infersight.alerts.release.paired_checks import PairPolicy
    from infersight.monitor.redaction import redact_url

    from .pair_feed import PROXY_PAIRS_OFF
    from .release_verdicts import ReleaseVerdicts, VerdictCollector

    backend, config = service.parts.backend, service.config
    feed = getattr(backend, "pair_feed", None)
    if feed is None:
        off = PROXY_PAIRS_OFF if config.upstream is not None else "paired checks off: no pairs are made here"
        verdicts = ReleaseVerdicts(min_pairs=PairPolicy().min_pairs, source=off, enabled=False)
    else:
        evidence = feed.evidence
        shadow = config.shadow_upstream
        if shadow is not None:
            source = (f"shadow_upstream {redact_url(shadow.url)}: {shadow.share:g} of the live upstream's "
                      "successful answers asked again (live: candidate, shadow: baseline)")  # fmt: skip
            answered = getattr(backend, "answered_as", lambda version: False)
            known = lambda version: answered(version) or version == shadow.model  # noqa: E731
        else:
            share = config.engine.pair_share if config.engine is not None else 0.0
            source = f"the embedded runtime's paired answers (engine.pair_share {share:g})"
            registry = getattr(getattr(backend, "runtime", None), "registry", None)
            known = lambda version: registry is not None and version in registry  # noqa: E731
        policy = evidence.policy
        verdicts = ReleaseVerdicts(min_pairs=policy.min_pairs, source=source, enabled=evidence.enabled,
                                   known=known, decide=policy.decide, max_pairs=policy.max_pairs)  # fmt: skip
        if not evidence.enabled:
            verdicts.source = evidence.off_reason
        evidence.listeners.append(verdicts.update)
    service.parts.verdicts = verdicts
    service.registry.register(VerdictCollector(verdicts))


def _wire_upstream_metrics(service: Service) -> None:
    """The upstream's own queue depth (vLLM, TGI), read from its Prometheus text."""
    from .backend_proxy import UpstreamQueueScraper

    upstream = service.config.upstream
    assert upstream is not None
    url = upstream.url.rstrip("/") + "/metrics" if upstream.metrics_url is None else upstream.metrics_url
    if not url:
        return
    from .backend_proxy import ProxyBackend

    stats, backend = service.parts.stats, service.parts.backend
    assert stats is not None and isinstance(backend, ProxyBackend)  # wired just before
    scraper = UpstreamQueueScraper(
        url, stats, backend, model=upstream.model,
        registry=service.registry,
        timeout_s=min(5.0, upstream.timeout_s),
    )  # fmt: skip
    service.parts.upstream_metrics = scraper
    service.scheduler.add("upstream_metrics", scraper.scrape_once, service.config.schedule.upstream_metrics_s)


def _canary_decided(service: Service, decision: Any) -> None:
    from .wiring_alerts import record_canary_decision

    parts = service.parts
    record_canary_decision(service.db, decision, deploy_log=parts.deploy_log, alerts=parts.alerts)


def _canary_rollback(service: Service, decision: Any) -> None:
    """After `_canary_decided` raised the alert: the rollback, through the action runner."""
    from .wiring_alerts import roll_back_canary

    parts = service.parts
    canary = getattr(getattr(parts.backend, "runtime", None), "canary", None)
    roll_back_canary(service.db, decision, canary, deploy_log=parts.deploy_log, alerts=parts.alerts)


def _wire_drift(service: Service) -> None:
    if not service.config.drift.enabled:
        return
    from .wiring_drift import DriftWiring

    parts, scheduler, schedule = service.parts, service.scheduler, service.config.schedule
    assert service.reservoir is not None  # made whenever drift is enabled
    wiring = DriftWiring(
        service.config.drift, service.db, service.registry, service.reservoir, writer=service.writer,
        canary=getattr(parts.backend, "canary_controller", None), on_alarm=lambda: scheduler.run_now("drift"),
        detector=parts.drift_detector, interval_s=schedule.embed_s,
    )  # fmt: skip
    wiring.store_configured_reference()
    parts.drift = wiring
    feed = getattr(parts.backend, "pair_feed", None)
    if feed is not None:  # pairs are embedded by the same model as the drift texts
        feed.detector = wiring.detector
    scheduler.add("drift", wiring.evaluate, schedule.drift_s, leader_only=True)
    scheduler.add("embed", wiring.embed, schedule.embed_s)


def _pair_evidence(parts: Parts) -> Any:
    """What the post-deploy analysis reads of pairs: the embedded runtime's (pair_feed.py), or,
    in proxy mode, evidence that is off and says why in every verdict."""
    from infersight.alerts.release.paired_checks import PairedEvidence

    from .pair_feed import PROXY_PAIRS_OFF

    feed = getattr(parts.backend, "pair_feed", None)
    return feed.evidence if feed is not None else PairedEvidence(enabled=False, off_reason=PROXY_PAIRS_OFF)


def _wire_alerts(service: Service) -> None:
    if not service.config.alerting.enabled:
        return
    from infersight.monitor.dataset import fill_collections

    from .wiring_alerts import AlertStoreCollector, AlertsWiring

    parts = service.parts
    assert service.pipeline is not None
    wiring = AlertsWiring(
        service.config, service.db, data_dir=service.data_dir, registry=service.registry,
        exposition=service.exposition, pipeline=service.pipeline, replica_id=service.replica_id,
        stats=parts.stats, gpu=parts.gpu, process=parts.process, drift=parts.drift,
        runtime=getattr(parts.backend, "runtime", None), deploy_log=parts.deploy_log, pairs=_pair_evidence(parts),
    )  # fmt: skip
    parts.alerts = wiring
    # store-wide figures come from the leader alone: a sum over replicas counts them once
    service.registry.register(AlertStoreCollector(service.db, leading=service.scheduler.leader.is_leader))
    schedule = service.config.schedule
    if wiring.replicas is not None:
        service.parts.replicas = wiring.replicas
        wiring.replicas.leader = service.scheduler.leader.is_leader
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
