"""Cost per 1000 output tokens, by model version, from what serving costs per hour.

`cost: {per_hour: 4.10}` prices the process (`per: device`: each GPU the GPU collector
sees). Over a trailing window, the cost of that window is shared among the versions in
proportion to the request-seconds each kept the server busy (a version twice as slow per
request is charged twice as much for it), then divided by the output tokens it produced:

    cost_per_1k(v) = per_hour * devices * span_h * busy_s(v) / busy_s(all) / tokens(v) * 1000

where span is the window, or the time since the meter started if shorter. The series carry
`model` and `model_version`; a `path` label is added when records carry one (a routing layer
would set it; none does yet).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from infersight.monitor.records import InferenceRecord
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

__all__ = ["CostMeter", "VersionCost"]

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
