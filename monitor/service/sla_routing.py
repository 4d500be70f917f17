"""SLA routing in `infersight serve`: the `routing:` config turned into the runtime's
`RoutingSpec`, and what routing shows (`/metrics`, the page, the breaker's events).

Metrics (all by `path`, "fast" or "standard"):
- `infersight_route_requests_total{path, reason}`: where the router sent requests and why
  ("short", "long", "classifier", "classifier_error", "spill", "breaker"; "shed": refused
  by the open breaker; "overloaded": refused by admission control, the path's queue full),
  read from the runtime at scrape time;
- `infersight_route_request_duration_seconds{path}`: arrival to last token, a histogram of
  the served requests and those the server failed (the collectors' request-duration
  buckets, so an SLO's threshold is a bucket bound), and
  `infersight_route_request_errors_total{path}`: those the server failed; with
  `reason="shed"` above, what the exported path SLOs count (alerts/rules/slo.py);
- `infersight_slo_attainment_ratio{path, window}`: share of the path's requests (client
  errors excluded, server errors and shed requests counted as misses) within its SLA, over
  the last 5 minutes and the last hour;
- `infersight_route_breaker_state{path}` (0 closed, 1 half-open, 2 open),
  `infersight_route_breaker_threshold_tokens{path}`, `infersight_route_batch_cap{path}`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from infersight.collectors import DURATION_BUCKETS
from infersight.monitor.outcomes import REFUSED_BY_SERVICE, Outcome, is_server_error, outcome_of
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from .config import RoutingConfig
from .errors import ConfigInvalid

__all__ = ["ATTAINMENT_WINDOWS", "RouteMetrics", "routing_spec", "start_routing"]

log = logging.getLogger(__name__)

ATTAINMENT_WINDOWS = (("5m", 300.0), ("1h", 3600.0))
_BUCKET_S = 10.0
_STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2}


def routing_spec(config: RoutingConfig) -> Any:
    """The engine's `RoutingSpec` for `config` (the classifier imported)."""
    from infersight.engine.routing import PathSpec, RoutingSpec

    classifier: Any = None
    if config.classifier is not None:
        from infersight.monitor.dataset import RedactorInvalid, load_redactor

        try:
            classifier = load_redactor(config.classifier)  # the same "module:function" import as `redact`
        except RedactorInvalid as exc:
            raise ConfigInvalid("routing.classifier", str(exc).split(": ", 1)[-1]) from exc

    def path(name: str) -> PathSpec:
        p = getattr(config, name)
        return PathSpec(p.version, p.sla_ms, p.max_prompt_tokens, p.max_new_tokens)

    return RoutingSpec(
        fast=path("fast"), standard=path("standard"), classifier=classifier,
        breaker_action="standard" if config.breaker_action == "standard" else "reject",
        breaker_cooldown_s=config.breaker_cooldown_s,
    )  # fmt: skip


def start_routing(runtime: Any, config: RoutingConfig) -> None:
    """Load the fast path beside the serving (standard) version; a version that cannot be
    served refuses the start, naming the key."""
    from infersight.engine.errors import EngineError

    spec = routing_spec(config)
    try:
        runtime.routing.start(spec)
    except EngineError as exc:
        raise ConfigInvalid("routing.fast.version", f"{config.fast.version} cannot be served: {exc}") from exc


class RouteMetrics:
    """Per-path latency and SLA attainment, observed per finished request (a lock and two
    adds), and the runtime's routing state read at scrape time."""

    def __init__(
        self, runtime: Any, config: RoutingConfig, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.runtime = runtime
        self.config = config
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=False)
        self.duration = Histogram(
            "infersight_route_request_duration_seconds", "Arrival to last token, by routing path", ["path"],
            buckets=DURATION_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.errors = Counter(
            "infersight_route_request_errors", "Requests the server failed, by routing path", ["path"],
            registry=self.registry,
        )  # fmt: skip
        for name in ("fast", "standard"):
            self.duration.labels(name)
            self.errors.labels(name)
        self.registry.register(_Collector(self))
        self._lock = threading.Lock()
        # path -> bucket index -> [total, within SLA]
        self._buckets: dict[str, dict[int, list[int]]] = {"fast": {}, "standard": {}}
        self.transitions: list[tuple[float, str, str]] = []  # (at, path, state), the last 50

    def sla_s(self, path: str) -> float:
        return float(getattr(self.config, path).sla_ms) / 1000.0

    def observe(self, path: str | None, duration_s: float, error_type: str | None) -> None:
        """One finished (or shed) request of `path`."""
        if path not in self._buckets or outcome_of(error_type) in (Outcome.CLIENT_ERROR, Outcome.CANCELLED):
            return
        ok = error_type is None and duration_s <= self.sla_s(path)
        if error_type not in REFUSED_BY_SERVICE:  # shed: counted by the runtime (`reason="shed"`)
            self.duration.labels(path).observe(duration_s)
        if is_server_error(error_type):
            self.errors.labels(path).inc()
        index = int(self.clock() // _BUCKET_S)
        with self._lock:
            buckets = self._buckets[path]
            counts = buckets.get(index)
            if counts is None:
                counts = buckets[index] = [0, 0]
                oldest = index - math.ceil(ATTAINMENT_WINDOWS[-1][1] / _BUCKET_S)
                for old in [i for i in buckets if i <= oldest]:
                    del buckets[old]
            counts[0] += 1
            counts[1] += ok

    def attainment(self, path: str, window_s: float) -> float | None:
        """Share within the SLA over the last `window_s` (None: no request)."""
        first = int(self.clock() // _BUCKET_S) - max(1, math.ceil(window_s / _BUCKET_S)) + 1
        with self._lock:
            total = good = 0
            for index, (n, ok) in self._buckets[path].items():
                if index >= first:
                    total, good = total + n, good + ok
        return good / total if total else None

    def on_event(self, event: Any) -> None:
        """The runtime's `BreakerChanged` events go to the log (and the page's list)."""
        from infersight.engine.events import BreakerChanged

        if not isinstance(event, BreakerChanged):
            return
        p99 = "n/a" if event.p99_ms is None else f"{event.p99_ms:.0f} ms"
        log.warning("routing: %s path breaker %s (p99 %s, SLA %.0f ms, threshold %s tokens)", event.path,
                    event.state, p99, self.sla_s(event.path) * 1000.0, event.threshold_tokens)  # fmt: skip
        with self._lock:
            self.transitions = [*self.transitions[-49:], (event.at, event.path, event.state)]

    def to_json(self) -> dict[str, Any]:
        """What the page's routing panel draws."""
        routing = self.runtime.routing
        counts = routing.counts()
        breakers = {b.path: b for b in routing.statuses()}
        caps = routing.caps()
        paths = []
        for name in ("fast", "standard"):
            b = breakers.get(name)
            paths.append({
                "path": name, "version": getattr(self.config, name).version, "sla_ms": self.sla_s(name) * 1000.0,
                "attainment": {w: self.attainment(name, s) for w, s in ATTAINMENT_WINDOWS},
                "requests": {r: n for (p, r), n in sorted(counts.items()) if p == name},
                "breaker": b.state if b is not None else None,
                "p99_ms": b.p99_ms if b is not None else None,
                "threshold_tokens": b.threshold_tokens if b is not None else None,
                "batch_cap": caps.get(name),
            })  # fmt: skip
        with self._lock:
            events = [{"at": at, "path": p, "state": s} for at, p, s in self.transitions[-10:]]
        return {"paths": paths, "breaker_events": events}


class _Collector:
    def __init__(self, metrics: RouteMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        routing = m.runtime.routing
        requests = CounterMetricFamily(
            "infersight_route_requests", "Requests routed, by path and reason ('shed': refused by the breaker)",
            labels=["path", "reason"],
        )  # fmt: skip
        for (path, reason), n in sorted(routing.counts().items()):
            requests.add_metric([path, reason], n)
        attainment = GaugeMetricFamily(
            "infersight_slo_attainment_ratio", "Share of the path's requests within its SLA over the window",
            labels=["path", "window"],
        )  # fmt: skip
        state = GaugeMetricFamily(
            "infersight_route_breaker_state", "Length breaker: 0 closed, 1 half-open, 2 open", labels=["path"]
        )
        threshold = GaugeMetricFamily(
            "infersight_route_breaker_threshold_tokens",
            "While the breaker is open: longer requests (prompt + max_new_tokens) are shed", labels=["path"],
        )  # fmt: skip
        cap = GaugeMetricFamily(
            "infersight_route_batch_cap", "Requests the path runs at once (1-4-8-16, from measured steps)",
            labels=["path"],
        )  # fmt: skip
        sla = GaugeMetricFamily("infersight_route_sla_seconds", "The path's latency SLA", labels=["path"])
        for path in ("fast", "standard"):
            sla.add_metric([path], m.sla_s(path))
            for window, seconds in ATTAINMENT_WINDOWS:
                value = m.attainment(path, seconds)
                if value is not None:
                    attainment.add_metric([path, window], value)
        for b in routing.statuses():
            state.add_metric([b.path], _STATE_VALUE[b.state])
            if b.threshold_tokens is not None:
                threshold.add_metric([b.path], b.threshold_tokens)
        for path, value in routing.caps().items():
            cap.add_metric([path], value)
        yield from (requests, attainment, state, threshold, cap, sla)
