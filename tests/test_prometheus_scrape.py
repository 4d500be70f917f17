"""A real Prometheus (Debian's package) scrapes the SDK's /metrics; its histogram_quantile
agrees with the exact p99 of what was sent within one bucket, and the in-process sketch
agrees within its stated relative accuracy."""

from __future__ import annotations

import math
import random
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _prometheus_support import prometheus_server, query, wait_for_prometheus
from conftest import free_port
from infersight.collectors import DURATION_BUCKETS
from infersight.monitor.sdk import Monitor

N_REQUESTS = 1000


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    return query(base, promql)


_wait_for = wait_for_prometheus


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A Prometheus on a free loopback port; yields (its base URL, the port it scrapes)."""
    target = free_port()
    with prometheus_server(tmp_path, [target]) as base:
        yield base, target


def test_prometheus_p99_and_sketch_p99_agree_with_the_exact_p99(prometheus: tuple[str, int]) -> None:
    base, target = prometheus
    clock = Clock()
    monitor = Monitor(clock=clock)

    @monitor.track(model="fraud-triage", model_version="v7")
    def answer(prompt: str, latency: float) -> str:
        clock.t += latency  # the injected clock: known latencies without waiting for them
        return prompt

    server = monitor.serve_metrics(port=target)
    try:
        _wait_for(
            "Prometheus ready", lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200
        )
        count = "sum(gen_ai_server_request_duration_seconds_count)"
        _wait_for("the first scrape (series at zero)", lambda: _query(base, count))

        rng = random.Random(20240601)
        latencies = [rng.lognormvariate(math.log(0.2), 0.8) for _ in range(N_REQUESTS)]
        for i, latency in enumerate(latencies):
            answer(f"q{i}", latency)
        _wait_for(
            f"a scrape with all {N_REQUESTS} requests",
            lambda: [r for r in _query(base, count) if float(r["value"][1]) == N_REQUESTS],
        )

        exact = sorted(latencies)[math.ceil(0.99 * N_REQUESTS) - 1]  # nearest rank = rank floor(q(n-1))
        upper_index = next(i for i, b in enumerate(DURATION_BUCKETS) if exact <= b)
        lower = DURATION_BUCKETS[upper_index - 1] if upper_index else 0.0
        upper = DURATION_BUCKETS[upper_index]
        for promql in (
            "histogram_quantile(0.99, sum by (le) (increase(gen_ai_server_request_duration_seconds_bucket[5m])))",
            "histogram_quantile(0.99, sum by (le) (gen_ai_server_request_duration_seconds_bucket))",
        ):
            (result,) = _query(base, promql)
            estimate = float(result["value"][1])
            print(f"{promql[:40]}... -> {estimate:.4f}; exact {exact:.4f} in ({lower}, {upper}]")
            assert lower <= estimate <= upper, (promql, estimate, exact, (lower, upper))

        sketch = monitor.stats.quantile("request_duration", 0.99, monitor.stats.window_s)
        assert sketch is not None
        assert abs(sketch - exact) <= monitor.stats.relative_accuracy * exact, (sketch, exact)
    finally:
        server.close()
