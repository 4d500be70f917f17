"""Feedback, satisfaction and the environment record, wired into a started service.

`BusinessWiring` records the environment at start (and at each deploy of the embedded
runtime), raises `DependencyChanged` when a start or deploy runs on other versions than
the record before it, refreshes the satisfaction fits on the scheduler (they feed
`/metrics`), deletes expired orphan feedback, and is the diagnoser behind the alerts'
`diagnose` action. With the embedded engine, `StepTimeHistory` keeps the engine's decode
step times by batch size on the service's sampling tick: the engine holds only a current
estimate per batch size, and the step check needs the baseline window's too."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from infersight.monitor.business import (
    COMPONENTS,
    EnvironmentRecord,
    SatisfactionFit,
    StepSample,
    changed_components,
    current_environment,
    diagnose,
    expire_orphans,
    joined_feedback,
    record_environment,
    satisfaction_by_group,
)
from prometheus_client.metrics_core import GaugeMetricFamily, InfoMetricFamily, Metric
from sqlalchemy import Engine

__all__ = [
    "DEPENDENCY_ALERT",
    "BusinessWiring",
    "SatisfactionMetrics",
    "StepTimeHistory",
    "engine_native_level",
]

log = logging.getLogger(__name__)

DEPENDENCY_ALERT = "DependencyChanged"
_SATISFACTION_WINDOW_S = 7 * 86_400.0  # the fits read a week of rated requests
_WINDOW_S, _BASELINE_OFFSET_S = 900.0, 86_400.0  # the diagnosis's window and its baseline a day back
_HISTORY_S = _BASELINE_OFFSET_S + _WINDOW_S  # the baseline window starts this long before now


class StepTimeHistory:
    """The embedded engine's decode step seconds by batch size, one `StepSample` per serving
    version (stable, canary: two at most) per `tick_s` tick in which it stepped, kept for
    `keep_s` (the diagnosis's reach back to its baseline window).

    `source()` answers the runtime's `step_times()`: version -> its replica's `StepTimes`.
    A tick records the sizes measured since the tick before (`recent_decode_s` over the
    steps run in between), so a size the engine last ran hours ago is not recorded again
    as if it ran now; an idle tick records nothing."""

    def __init__(
        self, source: Callable[[], Mapping[str, Any]], *, tick_s: float, keep_s: float = _HISTORY_S
    ) -> None:
        self.source = source
        self.keep_s = keep_s
        self._points: deque[StepSample] = deque(maxlen=2 * (int(keep_s / max(tick_s, 1e-3)) + 1))
        self._steps: dict[str, tuple[int, int]] = {}  # version -> (id of its StepTimes, steps then)
        self._lock = threading.Lock()

    def sample(self, now: float) -> None:
        counted: dict[str, tuple[int, int]] = {}  # versions no longer serving are forgotten
        for version, times in dict(self.source()).items():
            steps = int(times.steps)
            seen, before = self._steps.get(version, (id(times), 0))
            ran = steps - before if seen == id(times) and steps >= before else steps  # a new replica: from 0
            counted[version] = (id(times), steps)
            decode = times.recent_decode_s(ran) if ran > 0 else {}
            if decode:
                with self._lock:
                    self._points.append(StepSample(now, version, dict(decode)))
        self._steps = counted
        with self._lock:
            while self._points and self._points[0].at < now - self.keep_s:
                self._points.popleft()

    def samples(self) -> list[StepSample]:
        with self._lock:
            return list(self._points)


class SatisfactionMetrics:
    """A collector: the latest satisfaction fits and the environment, at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fits: list[SatisfactionFit] = []
        self.versions: Mapping[str, str | None] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            fits, versions = list(self.fits), dict(self.versions)
        ratio = GaugeMetricFamily("infersight_satisfaction_ratio", "Mean feedback score of rated requests (0..1)",
                                  labels=["version", "path"])  # fmt: skip
        rated = GaugeMetricFamily("infersight_satisfaction_rated_requests", "Rated requests in the fit",
                                  labels=["version", "path"])  # fmt: skip
        bucket = GaugeMetricFamily("infersight_satisfaction_bucket_ratio",
                                   "Mean feedback score of rated requests by latency bucket (upper edge le, seconds)",
                                   labels=["version", "path", "metric", "le"])  # fmt: skip
        worth = GaugeMetricFamily("infersight_satisfaction_worth_points",
                                  "Points of satisfaction a p99 cut to half is worth (fitted curve)",
                                  labels=["version", "path", "metric", "bound"])  # fmt: skip
        for fit in fits:
            path = fit.path or ""
            if fit.metric == "e2e":
                ratio.add_metric([fit.model_version, path], fit.satisfaction)
                rated.add_metric([fit.model_version, path], fit.n)
            for b in fit.buckets:
                if b.satisfaction is not None:
                    le = "+Inf" if b.le_s == float("inf") else repr(b.le_s)
                    bucket.add_metric([fit.model_version, path, fit.metric, le], b.satisfaction)
            if fit.worth is not None:
                for name, v in (
                    ("estimate", fit.worth.points),
                    ("low", fit.worth.low),
                    ("high", fit.worth.high),
                ):
                    worth.add_metric([fit.model_version, path, fit.metric, name], v)
        yield from (ratio, rated, bucket, worth)
        if versions:
            info = InfoMetricFamily("infersight_build", "Versions of the software this service runs on")
            info.add_metric([], {k: str(versions.get(k) or "") for k in COMPONENTS})
            yield info


def engine_native_level() -> str | None:
    """The instruction-set level of the packaged native library the engine would load: the
    best one this CPU runs whose library was built (engine/isa.py; nothing is loaded)."""
    from pathlib import Path

    from infersight.engine import isa

    folder = Path(isa.__file__).resolve().parent
    for level in isa.supported(isa.cpu_flags()):
        if (folder / level.library).is_file():
            return level.name
    return None


class BusinessWiring:
    def __init__(
        self,
        db: Engine,
        *,
        clock: Callable[[], float],
        feedback_ttl_s: float,
        long_prompt_tokens: int,
        replica: str | None = None,
        readings: Callable[[float], Mapping[str, Any]] | None = None,
        cuda_driver: Callable[[], str | None] | None = None,
        environment: Callable[[], Mapping[str, str | None]] | None = None,
        steps: StepTimeHistory | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.feedback_ttl_s = feedback_ttl_s
        self.long_prompt_tokens = long_prompt_tokens
        self.replica = replica
        self.readings = readings  # the service's time series of the last N seconds (memory, load)
        self.steps = steps  # the embedded engine's decode steps (None: proxy mode)
        self._environment = environment or (
            lambda: current_environment(cuda_driver=cuda_driver, engine_native=engine_native_level)
        )
        self.metrics = SatisfactionMetrics()

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC)

    def record_environment(
        self, reason: str
    ) -> tuple[EnvironmentRecord, dict[str, tuple[str | None, str | None]]]:
        """Keeps the environment now -> (the record, what changed since the one before).
        A change raises DependencyChanged (info) for an hour."""
        from infersight.alerts.lifecycle import push_alert

        now = self.now()
        record, before = record_environment(self.db, self._environment(), reason=reason, now=now,
                                            replica=self.replica)  # fmt: skip
        self.metrics.versions = record.versions
        changed = changed_components(before.versions, record.versions) if before is not None else {}
        if changed:
            text = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
            with self.db.begin() as conn:
                push_alert(
                    conn, DEPENDENCY_ALERT, {"severity": "info", "reason": reason},
                    {"summary": f"this {reason} runs on changed versions: {text}"},
                    now=now, ends_at=now + dt.timedelta(hours=1), value=float(len(changed)),
                )  # fmt: skip
            log.warning("the %s runs on changed versions: %s", reason, text)
        return record, changed

    def on_deploy_event(self, event: Any) -> None:
        if type(event).__name__ == "VersionDeployed":  # the runtime's event (the engine is not imported)
            try:
                self.record_environment("deploy")
            except Exception as exc:  # a record missed is no reason to fail the deploy log
                log.warning("could not record the environment at a deploy: %s", exc)

    def refresh(self) -> None:
        """The scheduler's job: expire orphans, then refit (both latency metrics)."""
        now = self.now()
        expire_orphans(self.db, now=now, ttl_s=self.feedback_ttl_s)
        items = joined_feedback(self.db, since=now - dt.timedelta(seconds=_SATISFACTION_WINDOW_S))
        fits = [
            f
            for metric in ("e2e", "ttft")
            for f in satisfaction_by_group(items, metric=metric, bootstrap=100)
        ]
        self.metrics.fits = fits

    def diagnose(
        self, alertname: str | None, labels: Mapping[str, str], now: dt.datetime
    ) -> Mapping[str, Any]:
        readings = self.readings(_HISTORY_S) if self.readings is not None else None
        found = diagnose(self.db, now=now, model_version=labels.get("model_version"), window_s=_WINDOW_S,
                         baseline_offset_s=_BASELINE_OFFSET_S, long_prompt_tokens=self.long_prompt_tokens,
                         readings=readings, step_samples=None if self.steps is None else self.steps.samples())  # fmt: skip
        return {"alertname": alertname, **found.to_json()}
