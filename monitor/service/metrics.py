"""What the service measures and exposes: its own Prometheus metrics and the combined
`/metrics`, the cost meter, and the page's timeseries.

The service's own Prometheus metrics (ingest, store writes, scheduler, drift backlog),
registered in the registry the service owns; `/metrics` exposes it with the collectors'.

Cost per 1000 output tokens, by model version, from what serving costs per hour.

`cost: {per_hour: 4.10}` prices the process (`per: device`: each GPU the GPU collector
sees). Over a trailing window, the cost of that window is shared among the versions in
proportion to the request-seconds each kept the server busy (a version twice as slow per
request is charged twice as much for it), then divided by the output tokens it produced:

    cost_per_1k(v) = per_hour * devices * span_h * busy_s(v) / busy_s(all) / tokens(v) * 1000

where span is the window, or the time since the meter started if shorter. The series carry
`model` and `model_version`; a `path` label is added when records carry one (a routing layer
would set it; none does yet).

The ring buffer behind `GET /api/v1/timeseries`: one point per scheduler tick, a fixed
number of points kept (memory never grows), `None` where a signal had no data.

One point of the page's timeseries, read from the live statistics and the samplers."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infersight.monitor.records import InferenceRecord
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "SERIES",
    "CombinedRegistry",
    "CostMeter",
    "ServiceMetrics",
    "Timeseries",
    "VersionCost",
    "timeseries_point",
]


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
        # the OTLP receiver (routers/otlp.py): spans by what became of them, exports by answer
        self.otlp_spans = Counter(
            "infersight_otlp_spans", "Spans received at /v1/traces: accepted, or the reason they were not",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self.otlp_exports = Counter(
            "infersight_otlp_exports",
            "Exports received at /v1/traces, by answer",
            ["outcome"],
            registry=registry,
        )
        self.otlp_finish_reasons = Counter(
            "infersight_otlp_finish_reasons", "Finish reasons of the model calls received over OTLP",
            ["reason"], registry=registry,
        )  # fmt: skip
        # accepted, or why not: otlp_spans.py's SKIP_REASONS and REJECT_REASONS
        spans = ("accepted", "not_genai", "not_a_generation", "evaluation", "no_id", "no_model", "bad_timing", "bad_value")
        for outcome in spans:
            self.otlp_spans.labels(outcome)
        for outcome in ("ok", "partial", "invalid", "unauthorized", "overloaded"):
            self.otlp_exports.labels(outcome)
        # requests refused before any routing (rate_limit.py): counted, never recorded one by one
        self.http_refused = Counter(
            "infersight_http_refused", "Requests refused before routing, by reason (client_rate: "
            "over the client's request rate; token_client_rate: the same, with the token)",
            ["reason"], registry=registry,
        )  # fmt: skip
        for reason in ("client_rate", "token_client_rate"):
            self.http_refused.labels(reason)


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


Key = tuple[str, str, str | None]  # model, model_version, path


@dataclass(frozen=True)
class VersionCost:
    model: str
    model_version: str
    path: str | None
    output_tokens: int
    busy_s: float
    cost: float  # this version's share of the window's cost
    per_1k_output_tokens: float | None  # None: no output token in the window

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "model_version": self.model_version,
            "path": self.path,
            "output_tokens": self.output_tokens,
            "busy_s": self.busy_s,
            "cost": self.cost,
            "per_1k_output_tokens": self.per_1k_output_tokens,
        }


class CostMeter:
    def __init__(
        self,
        per_hour: float,
        *,
        devices: Callable[[], int] = lambda: 1,
        window_s: float = 3600.0,
        bucket_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        label_set: Callable[[str, str], tuple[str, str]] | None = None,
    ) -> None:
        self.per_hour = per_hour
        self.devices = devices
        self.window_s = window_s
        self.bucket_s = bucket_s
        self.clock = clock
        # the live statistics' label cap (`other` past limits.max_label_values), so ingested
        # names cannot grow this meter's series without bound
        self.label_set = label_set
        self.started = clock()
        self._lock = threading.Lock()
        self._buckets: dict[int, dict[Key, list[float]]] = {}  # index -> key -> [tokens, busy_s]

    def observe(self, record: InferenceRecord) -> None:
        index = int(self.clock() // self.bucket_s)
        model, version = (
            self.label_set(record.model, record.model_version)
            if self.label_set is not None
            else (record.model, record.model_version)
        )
        key: Key = (model, version, getattr(record, "path", None))
        with self._lock:
            bucket = self._buckets.get(index)
            if bucket is None:
                bucket = self._buckets[index] = {}
                oldest = index - math.ceil(self.window_s / self.bucket_s)
                for old in [i for i in self._buckets if i <= oldest]:
                    del self._buckets[old]
            acc = bucket.setdefault(key, [0.0, 0.0])
            acc[0] += record.output_tokens or 0
            acc[1] += max(0.0, record.duration_s)

    def costs(self) -> list[VersionCost]:
        now = self.clock()
        first = int(now // self.bucket_s) - math.ceil(self.window_s / self.bucket_s) + 1
        totals: dict[Key, list[float]] = {}
        with self._lock:
            for index, bucket in self._buckets.items():
                if index >= first:
                    for key, (tokens, busy) in bucket.items():
                        acc = totals.setdefault(key, [0.0, 0.0])
                        acc[0] += tokens
                        acc[1] += busy
        busy_all = sum(busy for _, busy in totals.values())
        span_h = min(self.window_s, max(now - self.started, self.bucket_s)) / 3600.0
        window_cost = self.per_hour * max(1, self.devices()) * span_h
        out = []
        for (model, version, path), (tokens, busy) in sorted(totals.items(), key=str):
            cost = window_cost * busy / busy_all if busy_all > 0 else 0.0
            per_1k = cost / tokens * 1000.0 if tokens > 0 else None
            out.append(VersionCost(model, version, path, int(tokens), busy, cost, per_1k))
        return out

    def collect(self) -> Iterator[Metric]:
        costs = self.costs()
        paths = any(c.path is not None for c in costs)
        labels = ["model", "model_version", *(["path"] if paths else [])]
        per_1k = GaugeMetricFamily(
            "infersight_cost_per_1k_output_tokens",
            "Serving cost per 1000 output tokens over the cost window (busy-time share of cost.per_hour)",
            labels=labels,
        )
        for c in costs:
            if c.per_1k_output_tokens is not None:
                values = [c.model, c.model_version, *([c.path or ""] if paths else [])]
                per_1k.add_metric(values, c.per_1k_output_tokens)
        per_hour = GaugeMetricFamily(
            "infersight_cost_per_hour", "Configured serving cost per hour (all devices)"
        )
        per_hour.add_metric([], self.per_hour * max(1, self.devices()))
        yield from (per_1k, per_hour)


SERIES = (
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "ttft_p95_s",
    "requests_per_s",
    "errors_per_s",  # the server's errors
    "client_errors_per_s",  # refused for the client's fault: not errors
    "cancelled_per_s",  # the client hung up: not errors
    "gpu_sm_activity_ratio",
    "gpu_memory_used_bytes",
    "process_rss_bytes",
    "process_cpu_seconds_per_s",  # the process's CPU busy (1.0: one core) over the quantiles' window
)


class Timeseries:
    def __init__(self, capacity: int) -> None:
        self._points: deque[tuple[float, tuple[float | None, ...]]] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def append(self, t: float, values: Mapping[str, float | None]) -> None:
        unknown = set(values) - set(SERIES)
        if unknown:
            raise KeyError(f"unknown series {sorted(unknown)}; known: {', '.join(SERIES)}")
        point = tuple(_clean(values.get(name)) for name in SERIES)
        with self._lock:
            self._points.append((t, point))

    def window(self, seconds: float, *, now: float) -> dict[str, Any]:
        """`{"t": [...], "series": {name: [...]}}` for the points of the last `seconds`."""
        since = now - seconds
        with self._lock:
            points = [p for p in self._points if p[0] >= since]
        return {
            "t": [round(t, 3) for t, _ in points],
            "series": {name: [values[i] for _, values in points] for i, name in enumerate(SERIES)},
        }

    def __len__(self) -> int:
        return len(self._points)


def _clean(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def timeseries_point(
    stats: Any, gpu: Any, process: Any, *, window_s: float, tick_s: float
) -> dict[str, float | None]:
    point: dict[str, float | None] = {}
    if stats is not None:
        w = min(window_s, stats.window_s)
        point["latency_p50_s"] = stats.quantile("request_duration", 0.50, w)
        point["latency_p95_s"] = stats.quantile("request_duration", 0.95, w)
        point["latency_p99_s"] = stats.quantile("request_duration", 0.99, w)
        point["ttft_p95_s"] = stats.quantile("ttft", 0.95, w)
        # at least one whole interval back: a rate over a fraction of one counts few requests
        interval = float(getattr(getattr(stats, "local", stats), "interval_s", 1.0))
        rate_window = min(max(tick_s, interval, 1.0), stats.window_s)
        span = _counted_span(stats, rate_window)
        point["requests_per_s"] = stats.count(rate_window) / span
        point["errors_per_s"] = stats.count(rate_window, errors_only=True) / span
        point["client_errors_per_s"] = stats.count(rate_window, outcome="client_error") / span
        point["cancelled_per_s"] = stats.count(rate_window, outcome="cancelled") / span
    if gpu is not None:
        samples: Mapping[int, Any] = gpu.latest()
        activity = [s.sm_activity for s in samples.values() if getattr(s, "sm_activity", None) is not None]
        used = [
            s.memory_used_bytes for s in samples.values() if getattr(s, "memory_used_bytes", None) is not None
        ]
        point["gpu_sm_activity_ratio"] = sum(activity) / len(activity) if activity else None
        point["gpu_memory_used_bytes"] = float(sum(used)) if used else None
    if process is not None:
        sample = process.latest()
        rss = getattr(sample, "rss_bytes", None) if sample is not None else None
        point["process_rss_bytes"] = None if rss is None else float(rss)
        # over the window the latency quantiles cover, so the two line up point by point
        cpu_busy = getattr(process, "cpu_busy", None)
        point["process_cpu_seconds_per_s"] = cpu_busy(window_s) if cpu_busy is not None else None
    return point


def _counted_span(stats: Any, window_s: float) -> float:
    """The seconds that `stats.count(window_s)` counts: whole intervals from the one that
    holds `now - window_s` up to now (10 s each by default), not `window_s` itself. Dividing
    by `window_s` read a steady rate as a sawtooth up to eleven times it."""
    local = getattr(stats, "local", stats)  # MergedStats: the intervals are this process's
    interval = float(getattr(local, "interval_s", 0.0) or 0.0)
    clock = getattr(local, "clock", None)
    if interval <= 0 or clock is None:
        return window_s
    now = float(clock())
    first = math.floor((now - window_s) / interval) * interval
    return max(now - first, window_s)
