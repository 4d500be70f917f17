"""ProcessCollector: CPU seconds, RSS, threads and the RSS trend of one process (psutil).

Sampling happens on a background thread (`start()`) or by calling `sample_once()`;
a scrape only reads the latest sample. A process that is gone or not readable is
counted in `infersight_process_collector_errors_total{reason}`, never raised.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ._series import Periodic, Trend, register_fork_handler

__all__ = ["ProcessCollector", "ProcessSample"]


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    at: float  # the collector's clock (monotonic seconds)
    cpu_seconds: float  # user + system, since the process started
    rss_bytes: int
    threads: int
    rss_slope_bytes_per_minute: float | None  # least squares over the trend window


class ProcessCollector(Collector):
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        pid: int | None = None,
        interval_s: float = 1.0,
        trend_window_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        process: Any = None,
    ) -> None:
        """`process`: a `psutil.Process`-like object (the seam for tests); default: `pid`'s."""
        self.pid = os.getpid() if pid is None else pid
        self._process = process if process is not None else psutil.Process(self.pid)
        self._clock = clock
        self._trend = Trend(trend_window_s)
        self._cpu = Trend(trend_window_s)  # cumulative CPU seconds: its slope is the CPU busy
        self._latest: ProcessSample | None = None
        self._errors: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sampler = Periodic(self.sample_once, interval_s, name=f"infersight-process-{self.pid}")
        register_fork_handler(self)
        if registry is not None:
            registry.register(self)

    def start(self) -> ProcessCollector:
        self._sampler.start()
        return self

    def stop(self) -> None:
        self._sampler.stop()

    def sample_once(self) -> ProcessSample | None:
        try:
            with self._process.oneshot():
                cpu = self._process.cpu_times()
                rss = int(self._process.memory_info().rss)
                threads = int(self._process.num_threads())
        except psutil.NoSuchProcess:
            return self._fail("no_such_process")
        except psutil.AccessDenied:
            return self._fail("access_denied")
        except (psutil.Error, OSError):
            return self._fail("error")
        now = self._clock()
        with self._lock:
            self._trend.add(now, float(rss))
            self._cpu.add(now, float(cpu.user + cpu.system))
            sample = ProcessSample(
                pid=self.pid,
                at=now,
                cpu_seconds=float(cpu.user + cpu.system),
                rss_bytes=rss,
                threads=threads,
                rss_slope_bytes_per_minute=self._trend.slope_per_minute(),
            )
            self._latest = sample
        return sample

    def latest(self) -> ProcessSample | None:
        return self._latest

    def rss_slope(self, window_s: float) -> float | None:
        """RSS slope in bytes per minute over the last `window_s` (at most the trend window)."""
        with self._lock:
            return self._trend.slope_per_minute(window_s)

    def cpu_busy(self, window_s: float) -> float | None:
        """CPU seconds the process used per second over the last `window_s` (at most the
        trend window; 1.0: one core busy), None with fewer than three samples in it."""
        with self._lock:
            slope = self._cpu.slope_per_minute(window_s)
        return None if slope is None else max(0.0, slope / 60.0)

    def _fail(self, reason: str) -> ProcessSample | None:
        with self._lock:
            self._errors[reason] = self._errors.get(reason, 0) + 1
            self._latest = None
        return None

    def describe(self) -> Iterable[Metric]:
        return self._families(None, {})

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            return self._families(self._latest, dict(self._errors))

    def _families(self, s: ProcessSample | None, errors: dict[str, int]) -> list[Metric]:
        cpu = CounterMetricFamily(
            "infersight_process_cpu_seconds", "Supervised process CPU time (user + system).", labels=["pid"]
        )
        rss = GaugeMetricFamily(
            "infersight_process_resident_memory_bytes", "Supervised process RSS.", labels=["pid"]
        )
        threads = GaugeMetricFamily(
            "infersight_process_threads", "Supervised process threads.", labels=["pid"]
        )
        slope = GaugeMetricFamily(
            "infersight_process_resident_memory_slope_bytes_per_minute",
            "Least-squares slope of RSS over the trend window.",
            labels=["pid"],
        )
        errs = CounterMetricFamily(
            "infersight_process_collector_errors", "Failed process samples by reason.", labels=["reason"]
        )
        if s is not None:
            pid = [str(s.pid)]
            cpu.add_metric(pid, s.cpu_seconds)
            rss.add_metric(pid, s.rss_bytes)
            threads.add_metric(pid, s.threads)
            if s.rss_slope_bytes_per_minute is not None:
                slope.add_metric(pid, s.rss_slope_bytes_per_minute)
        for reason, n in sorted(errors.items()):
            errs.add_metric([reason], n)
        return [cpu, rss, threads, slope, errs]

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._sampler.after_fork_in_child()
