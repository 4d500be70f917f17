"""The service's own Prometheus metrics (ingest, store writes, scheduler, drift backlog),
registered in the registry the service owns; `/metrics` exposes it with the collectors'."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["CombinedRegistry", "ServiceMetrics"]


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.ingest_events = Counter(
            "infersight_ingest_events", "Events received at /api/v1/events", ["outcome"], registry=registry
        )
        self.ingest_batches = Counter(
            "infersight_ingest_batches", "Batches received at /api/v1/events", ["outcome"], registry=registry
        )
        for outcome in ("accepted", "rejected", "dropped"):  # at 0 from the first scrape (rate, increase)
            self.ingest_events.labels(outcome)
        for outcome in ("ok", "error"):
            self.ingest_batches.labels(outcome)
        self.store_rows_written = Counter(
            "infersight_store_requests_written", "Request rows committed to the store", registry=registry
        )
        self.store_write_errors = Counter(
            "infersight_store_write_errors", "Failed group commits of request rows", registry=registry
        )
        self.store_write_queue = Gauge(
            "infersight_store_write_queue_rows", "Request rows waiting to be written", registry=registry
        )
        self.observer_errors = Counter(
            "infersight_record_observer_errors", "Exceptions raised by a record observer", ["observer"],
            registry=registry,
        )  # fmt: skip
        self.texts_offered = Counter(
            "infersight_drift_texts_offered", "Sampled texts offered for embedding", registry=registry
        )
        self.texts_skipped = Counter(
            "infersight_drift_texts_skipped",
            "Sampled texts not embedded because the reservoir was full (embedding is reservoir-sampled)",
            registry=registry,
        )
        self.job_runs = Counter(
            "infersight_scheduler_job_runs", "Scheduled job runs", ["job", "outcome"], registry=registry
        )
        self.job_skipped = Counter(
            "infersight_scheduler_job_skipped",
            "Runs skipped because the previous run of the job was still going (max_instances=1)",
            ["job"],
            registry=registry,
        )
        self.job_duration = Histogram(
            "infersight_scheduler_job_duration_seconds", "Duration of scheduled job runs", ["job"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300), registry=registry,
        )  # fmt: skip
        self.leader = Gauge(
            "infersight_leader", "1 when this replica runs the leader-only jobs (rules, drift, outbox, retention)",
            registry=registry,
        )  # fmt: skip
        self.proxy_errors = Counter(
            "infersight_upstream_errors",
            "Upstream failures seen by the proxy",
            ["error_type"],
            registry=registry,
        )


class CombinedRegistry(Collector):
    """Collects from several registries (the service's, the collectors', drift's, alerts'),
    so that one `/metrics` exposes them all; a name exported twice is exposed once, with
    the series of both (a series, name and labels, exported twice is exposed once)."""

    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        self._registries = list(registries)

    def add(self, registry: CollectorRegistry) -> None:
        if all(registry is not r for r in self._registries):
            self._registries.append(registry)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for registry in self._registries:
            for metric in _collect(registry):
                first = families.get(metric.name)
                if first is None:
                    families[metric.name] = metric
                    continue
                if first.type != metric.type:
                    continue
                # the same name from two places (the SLO ledger's attainment by `slo`, routing's
                # by `path` and `window`): one family, each series once
                have = {(s.name, tuple(sorted(s.labels.items()))) for s in first.samples}
                first.samples.extend(
                    s for s in metric.samples if (s.name, tuple(sorted(s.labels.items()))) not in have
                )
        yield from families.values()


def _collect(registry: CollectorRegistry) -> Iterable[Metric]:
    return registry.collect()
