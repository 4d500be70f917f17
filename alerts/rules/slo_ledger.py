"""The SLO ledger: good and bad requests per SLO, counted in one-minute buckets over the
SLO's window, so the built-in evaluator reads burn rates over 5m .. 30d without Prometheus
(the collectors' sketches keep only an hour), and `/metrics` exports each SLO's error budget
remaining, attainment and burn rates.

It counts what this process observed since it started: after a restart the long windows
refill from zero (a Prometheus server running the exported rules keeps the long history).
Memory is bounded: at most window / bucket buckets per SLO (43,200 for 30d).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from infersight.monitor.records import InferenceRecord
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from ..errors import UnknownSignal
from ._yaml import format_duration
from .signals import Sample, Signal
from .slo import SLO

__all__ = ["SLOLedger", "SLOStatus"]


@dataclass(frozen=True)
class SLOStatus:
    """One SLO now, over its own window. `attainment` is None before any request."""

    name: str
    kind: str
    objective: float
    window_s: float
    total: int
    bad: int
    attainment: float | None
    budget_remaining: float  # 1 - bad share / budget: 1 untouched, 0 spent, negative overspent
    burn_rates: tuple[tuple[str, float | None], ...]  # (window, burn rate) of its alert windows

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "objective": self.objective,
            "window": format_duration(self.window_s),
            "total": self.total,
            "bad": self.bad,
            "attainment": self.attainment,
            "error_budget_remaining": self.budget_remaining,
            "burn_rates": dict(self.burn_rates),
        }


class SLOLedger:
    """`observe(record)` for every observed call; a `SignalSource` for `slo_burn_rate`;
    a Prometheus collector (register it in the service's registry)."""

    def __init__(
        self, slos: Sequence[SLO], *, bucket_s: float = 60.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.slos = {s.name: s for s in slos}
        self.bucket_s = bucket_s
        self.clock = clock
        self._lock = threading.Lock()
        # per SLO: bucket index -> [total, bad]
        self._buckets: dict[str, dict[int, list[int]]] = {s.name: {} for s in slos}

    def observe(self, record: InferenceRecord) -> None:
        labels = {"model": record.model, "model_version": record.model_version}
        path = getattr(record, "path", None)  # set by a routing layer; none does yet
        if path is not None:
            labels["path"] = path
        index = int(self.clock() // self.bucket_s)
        with self._lock:
            for slo in self.slos.values():
                if not slo.covers(labels):
                    continue
                buckets = self._buckets[slo.name]
                counts = buckets.get(index)
                if counts is None:
                    counts = buckets[index] = [0, 0]
                    oldest = index - math.ceil(slo.window_s / self.bucket_s)
                    for old in [i for i in buckets if i <= oldest]:
                        del buckets[old]
                counts[0] += 1
                counts[1] += slo.is_bad(record.duration_s, record.error_type)

    def counts(self, name: str, window_s: float) -> tuple[int, int]:
        """(total, bad) of SLO `name` over the last `window_s` (whole buckets, the current one
        included)."""
        first = int(self.clock() // self.bucket_s) - max(1, math.ceil(window_s / self.bucket_s)) + 1
        with self._lock:
            total = bad = 0
            for i, (t, b) in self._buckets[name].items():
                if i >= first:
                    total += t
                    bad += b
        return total, bad

    def burn_rate(self, name: str, window_s: float) -> float | None:
        total, bad = self.counts(name, window_s)
        return None if total == 0 else (bad / total) / self.slos[name].budget

    def status(self, name: str) -> SLOStatus:
        slo = self.slos[name]
        total, bad = self.counts(name, slo.window_s)
        share = bad / total if total else 0.0
        windows = sorted({s for w in slo.burn_windows for s in (w.long_s, w.short_s)})
        return SLOStatus(
            name=name,
            kind=slo.kind,
            objective=slo.objective,
            window_s=slo.window_s,
            total=total,
            bad=bad,
            attainment=1.0 - share if total else None,
            budget_remaining=1.0 - share / slo.budget,
            burn_rates=tuple((format_duration(w), self.burn_rate(name, w)) for w in windows),
        )

    def statuses(self) -> list[SLOStatus]:
        return [self.status(name) for name in self.slos]

    # -- SignalSource -----------------------------------------------------------------------
    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        if signal.kind != "slo_burn_rate":
            raise UnknownSignal(f"SLOLedger serves slo_burn_rate only, not {signal.kind!r}")
        names = [signal.slo] if signal.slo is not None else list(self.slos)
        out = []
        for name in names:
            if name not in self.slos:
                continue
            rate = self.burn_rate(name, signal.window_s or 0.0)
            if rate is not None:
                out.append(Sample.of(rate, **({"slo": name} if "slo" in by else {})))
        return out

    # -- prometheus_client Collector --------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        budget = GaugeMetricFamily(
            "infersight_slo_error_budget_remaining_ratio",
            "Share of the SLO's error budget left over its window (1 untouched, 0 spent, <0 overspent)",
            labels=["slo"],
        )
        attainment = GaugeMetricFamily(
            "infersight_slo_attainment_ratio", "Share of the SLO's requests that were good over its window",
            labels=["slo"],
        )  # fmt: skip
        objective = GaugeMetricFamily("infersight_slo_objective_ratio", "The SLO's objective", labels=["slo"])
        burn = GaugeMetricFamily(
            "infersight_slo_burn_rate", "Bad share of requests over the window / error budget",
            labels=["slo", "window"],
        )  # fmt: skip
        for s in self.statuses():
            budget.add_metric([s.name], s.budget_remaining)
            objective.add_metric([s.name], s.objective)
            if s.attainment is not None:
                attainment.add_metric([s.name], s.attainment)
            for window, rate in s.burn_rates:
                if rate is not None:
                    burn.add_metric([s.name, window], rate)
        yield from (budget, attainment, objective, burn)
