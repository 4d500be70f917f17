"""Wiring the other packages into a started `Service`: the collectors (live statistics,
GPU and process samplers), the `/v1` backend, drift and alerts. Each part is stored in
`service.parts` under its typed name; the routers read them from there."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import psutil

from .errors import ConfigInvalid
from .sampling import sample_timeseries

if TYPE_CHECKING:
    from .service import Service

__all__ = ["unwire_components", "wire_components"]

log = logging.getLogger(__name__)


def wire_components(service: Service) -> None:
    from .wiring_alerts import wire_alerts
    from .wiring_drift import wire_drift

    _wire_collectors(service)
    _wire_backend(service)
    wire_drift(service)
    wire_alerts(service)
    schedule = service.config.schedule
    service.scheduler.add("timeseries", lambda: sample_timeseries(service), schedule.timeseries_s)


def unwire_components(service: Service) -> None:
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
        from .cost import CostMeter

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

        service.parts.backend = ProxyBackend(
            service, config.upstream, transport=service._upstream_transport
        )
        _wire_upstream_metrics(service)
    elif config.engine is not None or service._runtime_seam is not None:
        from .backend_engine import EngineBackend
        from .deploy_log import DeployLog

        backend = EngineBackend.start(service)
        service.parts.backend = backend
        backend.observe_events()
        deploy_log = DeployLog(
            service.db,
            backend.runtime,
            service.registry,
            model=backend.model_name,
            replica=service.replica_id,
        )
        service.parts.deploy_log = deploy_log
        backend.resume_canary()
        deploy_log.flush()
        service.scheduler.add("deploy_log", deploy_log.flush, 1.0)


def _wire_upstream_metrics(service: Service) -> None:
    """The upstream's own queue depth (vLLM, TGI), read from its Prometheus text."""
    from .upstream_metrics import UpstreamQueueScraper

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

