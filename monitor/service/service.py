"""`Service`: the composition root. It owns the database, the metrics registry, the
record pipeline, the scheduler and whatever serves `/v1` (embedded runtime or upstream
proxy), and wires the collectors, drift and alerts packages to them. Nothing here is
module-level state: two services in one process (tests) share nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infersight.monitor.store import connect, current_revision, head_revision, sqlite_url, upgrade
from infersight.monitor.store.retention import enforce_retention, prune_snapshot_files
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from .config import ServiceConfig, is_loopback
from .errors import ConfigInvalid, InsecureBind
from .jobs import ServiceScheduler
from .leader import LeaderLock, leader_lock_for, new_replica_id
from .memory import limit_malloc_arenas, trim_heap
from .metrics import CombinedRegistry, ServiceMetrics
from .pipeline import RecordPipeline
from .reservoir import TextReservoir
from .security import load_or_create_token
from .timeseries import Timeseries
from .writer import RequestWriter

if TYPE_CHECKING:
    from infersight.collectors import GPUCollector, InferenceStats, ProcessCollector
    from infersight.monitor.drift import DriftDetector

    from .backend_engine import EngineBackend
    from .backend_proxy import ProxyBackend
    from .cost import CostMeter
    from .deploy_log import DeployLog
    from .replicas import Replicas
    from .routing import RouteMetrics
    from .upstream_metrics import UpstreamQueueScraper
    from .wiring_alerts import AlertsWiring
    from .wiring_drift import DriftWiring

__all__ = ["Parts", "Service"]


@dataclass
class Parts:
    """The parts wiring.py puts into a started service, each under its own typed name;
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
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.token = config.token or load_or_create_token(self.data_dir)
        self.database_url = config.database_url or sqlite_url(self.data_dir)
        self.db: Engine = connect(self.database_url)
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics = ServiceMetrics(self.registry)
        self.exposition = CombinedRegistry([self.registry])
        self.reservoir = TextReservoir(config.drift.reservoir, on_skip=self.metrics.texts_skipped.inc)
        self.writer: RequestWriter | None = None
        self.pipeline: RecordPipeline | None = None
        self.timeseries = Timeseries(config.limits.timeseries_points)
        self.scheduler = ServiceScheduler(
            self.metrics, leader or leader_lock_for(self.db, enabled=config.leader_election)
        )
        self._runtime_seam = runtime
        self._upstream_transport = upstream_transport
        self._nvml_seam = nvml  # the pynvml module or a stand-in (None: import pynvml)
        self.parts = Parts()  # the wired parts, typed (wiring.py)
        self.replica_id = new_replica_id()  # this process among the replicas on one database
        self.started_at: float | None = None
        self._started_mono: float | None = None
        self.schema_revision: str | None = None
        self.redactor: Callable[[str], str] | None = None  # config.redact, resolved at start

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        limit_malloc_arenas()  # before the service's threads exist: see memory.py
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
        from .wiring import wire_components

        wire_components(self)
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
        from .wiring import unwire_components

        unwire_components(self)
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.db.dispose()

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
