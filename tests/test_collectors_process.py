"""ProcessCollector on real processes (psutil), and the least-squares trend behind the slopes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from infersight.collectors import ProcessCollector
from infersight.collectors._series import Trend
from prometheus_client import CollectorRegistry, generate_latest


def test_samples_cpu_rss_and_threads_of_this_process() -> None:
    registry = CollectorRegistry()
    collector = ProcessCollector(registry)
    sum(i * i for i in range(200_000))  # burn a little CPU
    sample = collector.sample_once()
    assert sample is not None and sample.pid == os.getpid()
    assert sample.cpu_seconds > 0 and sample.rss_bytes > 10 << 20 and sample.threads >= 1
    body = generate_latest(registry).decode()
    assert f'infersight_process_resident_memory_bytes{{pid="{os.getpid()}"}}' in body
    assert "infersight_process_cpu_seconds_total" in body


def test_growing_memory_shows_as_a_positive_rss_slope() -> None:
    t = [0.0]
    collector = ProcessCollector(clock=lambda: t[0])
    hold = []
    for _ in range(6):
        # 48 MiB a minute, every page written (a zero-filled bytearray may stay unmapped
        # zero pages); large beside what the rest of the test process frees or takes meanwhile
        hold.append(b"\x01" * (48 << 20))
        t[0] += 60.0
        collector.sample_once()
    slope = collector.latest().rss_slope_bytes_per_minute  # type: ignore[union-attr]
    assert slope is not None and 36 << 20 < slope < 60 << 20
    assert collector.rss_slope(600) == pytest.approx(slope)
    del hold


def test_process_that_exited_is_counted_not_raised() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    registry = CollectorRegistry()
    collector = ProcessCollector(registry, pid=child.pid)
    child.wait()
    time.sleep(0.05)
    assert collector.sample_once() is None and collector.latest() is None
    assert (
        'infersight_process_collector_errors_total{reason="no_such_process"} 1.0'
        in generate_latest(registry).decode()
    )


def test_background_sampler_runs_until_stopped() -> None:
    collector = ProcessCollector(interval_s=0.05).start()
    deadline = time.monotonic() + 5
    while collector.latest() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    collector.stop()
    assert collector.latest() is not None


def test_trend_is_the_least_squares_slope_per_minute() -> None:
    trend = Trend(window_s=600)
    for i, noise in enumerate((3, -2, 1, -1, 2, -3, 0)):
        trend.add(1e9 + i * 30.0, 1000.0 + i * 50.0 + noise)  # +50 per 30 s = +100/min
    assert trend.slope_per_minute() == pytest.approx(100.0, rel=0.05)
    assert trend.slope_per_minute(window_s=60) == pytest.approx(100.0, rel=0.2)


def test_trend_forgets_points_older_than_its_window_and_needs_three_points() -> None:
    trend = Trend(window_s=100)
    trend.add(0.0, 0.0)
    trend.add(10.0, 1000.0)
    assert trend.slope_per_minute() is None
    for t in (200.0, 210.0, 220.0):
        trend.add(t, 5.0)
    assert trend.slope_per_minute() == 0.0  # the early ramp fell out of the window
