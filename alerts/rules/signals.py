"""The signals a rule can watch, and the one protocol through which they are read.

A signal is structured, not a query string: `{kind: latency_quantile, metric:
request_duration, quantile: 0.99, window: 5m}`. Each kind names the labels it can be
split by (`by`), the parameters it takes, and whether Prometheus can compute it
(see `signal_promql` in `config.py`). `SIGNAL_KINDS` is the explicit table; an unknown kind lists the valid ones.

Where signal values come from: the `SignalSource`s the evaluator reads.

- `LiveSignals`: the adapter from the collectors' query API (docs/architecture.md, "Live
  signals"): latency quantiles and error rates from `InferenceStats`' sliding-window
  sketches, GPU activity and memory from `GPUCollector.latest()`, RSS from
  `ProcessCollector.latest()`, drift / relevance from a `QualitySource` the service wires
  to the drift module. Memory slopes are least squares over the trend window.
- `StoreSignals`: read from the database: the outbox's dead letters, mean relevance, and
  for deployments without the live sketches, latency, error and request rates computed
  exactly from the shared `requests` table over the window.
- `StaticSignals`: values set by hand or pushed by another system (tests, benchmarks).
- `CompositeSignals`: one source per signal kind, the rest from a default.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from infersight.monitor.outcomes import is_server_error
from infersight.monitor.store.tables import outbox, requests, started_in
from sqlalchemy import Engine, func, select

from ..errors import UnknownSignal

__all__ = [
    "LATENCY_METRICS",
    "SIGNAL_KINDS",
    "CompositeSignals",
    "InferenceStatsLike",
    "LiveSignals",
    "QualitySource",
    "RemoteResources",
    "Sample",
    "Signal",
    "SignalKind",
    "SignalSource",
    "StaticSignals",
    "StoreSignals",
    "least_squares_slope",
    "quantile",
]


LATENCY_METRICS = ("request_duration", "ttft", "tpot", "queue_time")
DRIFT_FIELDS = ("prompt", "response")
LENGTH_FIELDS = ("prompt", "output")  # token lengths of requests (length_drift)
MEMORY_RESOURCES = ("gpu", "process")
_MODEL = ("model", "model_version")


@dataclass(frozen=True)
class SignalKind:
    name: str
    labels: tuple[str, ...]  # the labels samples of this kind can carry (and `by` may keep)
    params: tuple[str, ...]  # accepted parameters besides `kind`
    required: tuple[str, ...]
    meaning: str


SIGNAL_KINDS: Mapping[str, SignalKind] = {
    k.name: k
    for k in (
        SignalKind(
            "latency_quantile",
            _MODEL,
            ("metric", "quantile", "window"),
            ("metric", "quantile", "window"),
            "a quantile (seconds) of request_duration, ttft, tpot or queue_time over a sliding window",
        ),
        SignalKind(
            "error_rate",
            _MODEL,
            ("window", "min_requests"),
            ("window",),
            "failed requests / all requests over the window (0..1); no sample under min_requests",
        ),
        SignalKind("request_rate", _MODEL, ("window",), ("window",), "requests per second over the window"),
        SignalKind(
            "throughput_drop",
            _MODEL,
            ("window", "baseline"),
            ("window",),
            "1 - served output tokens/s over the window / the same window one baseline earlier (default 1d);"
            " no sample while demand (requests started) is lower",
        ),
        SignalKind("queue_depth", _MODEL, (), (), "requests waiting to be scheduled"),
        SignalKind("gpu_sm_activity", ("gpu", "uuid"), (), (), "GPM SM activity ratio (0..1), Hopper+"),
        SignalKind("gpu_memory_ratio", ("gpu", "uuid"), (), (), "GPU memory used / total (0..1)"),
        SignalKind(
            "memory_slope",
            ("gpu", "uuid", "pid"),
            ("resource", "window"),
            ("resource", "window"),
            "least-squares slope of GPU memory used or process RSS, bytes per minute",
        ),
        SignalKind(
            "drift_p_value",
            _MODEL,
            ("field",),
            ("field",),
            "p-value of the latest drift test (prompt or response)",
        ),
        SignalKind(
            "length_drift",
            _MODEL,
            ("field",),
            ("field",),
            "p-value of the latest request-length drift test (prompt or output token lengths)",
        ),
        SignalKind("relevance", _MODEL, (), (), "windowed mean prompt-response relevance (cosine)"),
        SignalKind(
            "dead_letters", (), (), (), "notifications that exhausted their retries (outbox dead letters)"
        ),
        SignalKind(
            "slo_burn_rate",
            ("slo",),
            ("slo", "window"),
            ("slo", "window"),
            "an SLO's bad share of requests over the window divided by its error budget (1 - objective)",
        ),
    )
}


@dataclass(frozen=True)
class Signal:
    """One structured signal. Parameters a kind does not take stay None."""

    kind: str
    metric: str | None = None
    quantile: float | None = None
    window_s: float | None = None
    field: str | None = None
    resource: str | None = None
    min_requests: int | None = None
    slo: str | None = None  # slo_burn_rate: the SLO's name (alerts/rules/slo.py)
    baseline_s: float | None = None  # throughput_drop: how far back the baseline window lies

    @property
    def spec(self) -> SignalKind:
        try:
            return SIGNAL_KINDS[self.kind]
        except KeyError:
            raise UnknownSignal(
                f"unknown signal kind {self.kind!r}; valid kinds: {', '.join(SIGNAL_KINDS)}"
            ) from None


@dataclass(frozen=True)
class Sample:
    """A signal's current value for one label set (labels sorted by name)."""

    labels: tuple[tuple[str, str], ...]
    value: float

    @classmethod
    def of(cls, value: float, **labels: str) -> Sample:
        return cls(tuple(sorted(labels.items())), float(value))

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


@runtime_checkable
class SignalSource(Protocol):
    """Reads a signal's current values, one `Sample` per label set, keeping only the
    labels named in `by` (the others are aggregated over). No data: an empty list."""

    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]: ...


class StaticSignals(SignalSource):
    """Values per signal kind and label set. `read` keeps the labels named in `by`; label
    sets that collapse onto the same `by` values keep the largest value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}

    def set(self, kind: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values.setdefault(kind, {})[tuple(sorted(labels.items()))] = float(value)

    def clear(self, kind: str, **labels: str) -> None:
        with self._lock:
            if labels:
                self._values.get(kind, {}).pop(tuple(sorted(labels.items())), None)
            else:
                self._values.pop(kind, None)

    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        with self._lock:
            values = dict(self._values.get(signal.kind, {}))
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in values.items():
            key = tuple((k, v) for k, v in labels if k in by)
            out[key] = max(value, out.get(key, value))
        return [Sample(k, v) for k, v in sorted(out.items())]


_DEMAND_SLACK = 0.1  # throughput_drop: demand this share under the baseline's still counts as not lower
_COLUMNS = {"request_duration": "duration_s", "ttft": "ttft_s", "tpot": "tpot_s", "queue_time": "queue_s"}


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class StoreSignals:
    KINDS = ("dead_letters", "latency_quantile", "error_rate", "request_rate", "relevance", "throughput_drop")

    def __init__(
        self, engine: Engine, *, clock: Callable[[], float] = time.time, relevance_window_s: float = 900.0
    ):
        self.engine = engine
        self.clock = clock
        self.relevance_window_s = relevance_window_s

    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        if signal.kind == "dead_letters":
            with self.engine.connect() as conn:
                n = conn.execute(
                    select(func.count()).select_from(outbox).where(outbox.c.state == "dead")
                ).scalar()
            return [Sample((), float(n or 0))]
        if signal.kind not in self.KINDS:
            raise UnknownSignal(
                f"StoreSignals does not serve {signal.kind!r}; it serves {', '.join(self.KINDS)}"
            )
        window = signal.window_s or self.relevance_window_s
        since = dt.datetime.fromtimestamp(self.clock() - window, dt.UTC)
        if signal.kind == "relevance":
            return self._relevance(since, by)
        if signal.kind == "throughput_drop":
            return self._throughput_drop(signal, by)
        if signal.kind == "latency_quantile":
            assert signal.metric is not None
            value_col = requests.c[_COLUMNS[signal.metric]]
        else:
            value_col = requests.c.error_type
        q = select(requests.c.model, requests.c.model_version, value_col).where(*started_in(since))
        groups: dict[tuple[tuple[str, str], ...], list[object]] = defaultdict(list)
        with self.engine.connect() as conn:
            for model, version, value in conn.execute(q):
                labels = {"model": model, "model_version": version}
                groups[tuple((k, v) for k, v in sorted(labels.items()) if k in by)].append(value)
        out = []
        for key, values in sorted(groups.items()):
            if signal.kind == "latency_quantile":
                xs = [float(v) for v in values if v is not None]  # type: ignore[arg-type]
                if xs:
                    out.append(Sample(key, quantile(xs, signal.quantile or 0.5)))
            elif signal.kind == "request_rate":
                out.append(Sample(key, len(values) / window))
            elif len(values) >= (signal.min_requests or 1):
                errors = sum(is_server_error(v) for v in values)  # type: ignore[arg-type]
                out.append(Sample(key, errors / len(values)))  # the client's outcomes are no errors
        return out

    def _relevance(self, since: dt.datetime, by: Sequence[str]) -> list[Sample]:
        """Mean relevance of the scored requests since `since`, per `by` group: summed in SQL
        per (model, version) over the partial index `ix_requests_relevance_time` (only the
        scored rows, index-only), then merged per group here."""
        r = requests.c
        q = (
            select(r.model, r.model_version, func.sum(r.relevance), func.count(r.relevance))
            .where(r.started_at >= since, r.relevance.is_not(None))
            .group_by(r.model, r.model_version)
        )
        sums: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
        with self.engine.connect() as conn:
            for model, version, total, n in conn.execute(q):
                labels = {"model": model, "model_version": version}
                acc = sums[tuple((k, v) for k, v in sorted(labels.items()) if k in by)]
                acc[0] += float(total or 0.0)
                acc[1] += int(n or 0)
        return [Sample(key, total / n) for key, (total, n) in sorted(sums.items()) if n]


    def _served(
        self, since: dt.datetime, until: dt.datetime, by: Sequence[str]
    ) -> dict[tuple[tuple[str, str], ...], list[float]]:
        """Per `by` group: [requests started, output tokens, requests with a token count]."""
        r = requests.c
        q = select(r.model, r.model_version, r.output_tokens).where(*started_in(since, until))
        out: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        with self.engine.connect() as conn:
            for model, version, tokens in conn.execute(q):
                labels = {"model": model, "model_version": version}
                acc = out[tuple((k, v) for k, v in sorted(labels.items()) if k in by)]
                acc[0] += 1
                if tokens is not None:
                    acc[1] += tokens
                    acc[2] += 1
        return out

    def _throughput_drop(self, signal: Signal, by: Sequence[str]) -> list[Sample]:
        """The share by which served throughput (output tokens/s) fell against the same
        window one baseline earlier. Only while demand (requests started) is not lower than
        the baseline's, within a tenth (a window's count is noisy): less traffic serves
        fewer tokens and is no slowdown. No sample where no request counts its tokens."""
        window = signal.window_s or 300.0
        offset = dt.timedelta(seconds=signal.baseline_s or 86_400.0)
        until = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        since = until - dt.timedelta(seconds=window)
        now, before = self._served(since, until, by), self._served(since - offset, until - offset, by)
        out = []
        for key, (n_now, tok_now, counted_now) in sorted(now.items()):
            n_before, tok_before, counted_before = before.get(key, (0.0, 0.0, 0.0))
            if n_before <= 0 or n_now < n_before * (1.0 - _DEMAND_SLACK):
                continue
            if counted_now and counted_before and tok_before > 0:
                out.append(Sample(key, 1.0 - tok_now / tok_before))
        return out


class CompositeSignals:
    """Serves each signal kind from the source named for it, others from `default`."""

    def __init__(self, default: SignalSource, **by_kind: SignalSource) -> None:
        self.default = default
        self.by_kind = by_kind

    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        source = self.by_kind.get(signal.kind, self.default)
        return source.read(signal, by)


class InferenceStatsLike(Protocol):
    def quantile(
        self,
        metric: str,
        q: float,
        window_s: float,
        *,
        model: str | None = None,
        model_version: str | None = None,
    ) -> float | None: ...

    def count(
        self,
        window_s: float,
        *,
        model: str | None = None,
        model_version: str | None = None,
        errors_only: bool = False,
    ) -> int: ...

    def labels(self) -> list[tuple[str, str]]: ...

    def waiting(self, *, model: str | None = None, model_version: str | None = None) -> int: ...


class QualitySource(Protocol):
    """Latest drift p-values (semantic and request-length) and windowed mean relevance per
    (model, model_version)."""

    def drift_p_values(self, field: str) -> Mapping[tuple[str, str], float]: ...

    def length_p_values(self, field: str) -> Mapping[tuple[str, str], float]: ...

    def relevance_means(self) -> Mapping[tuple[str, str], float]: ...


@dataclass(frozen=True)
class RemoteResources:
    """Another replica's latest readings: GPUs by index (objects with `uuid`,
    `sm_activity`, `memory_used_bytes`, `memory_total_bytes`, as `GPUSample`) and its
    process (an object with `pid` and `rss_bytes`, as `ProcessSample`), or None."""

    replica: str
    gpus: Mapping[int, Any] = field(default_factory=dict)
    process: Any = None


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Slope (value per second) of the least-squares line through (t, value) points."""
    if len(points) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in points) / den


def _keys(by: Sequence[str], labels: Iterable[tuple[str, str]]) -> set[tuple[str | None, str | None]]:
    """(model, version) label filters for `by`: None aggregates over that label."""
    keep_model, keep_version = "model" in by, "model_version" in by
    return {(m if keep_model else None, v if keep_version else None) for m, v in labels}


def _labels(by: Sequence[str], model: str | None, version: str | None) -> dict[str, str]:
    out = {}
    if "model" in by and model is not None:
        out["model"] = model
    if "model_version" in by and version is not None:
        out["model_version"] = version
    return out


class LiveSignals:
    def __init__(
        self,
        stats: InferenceStatsLike | None = None,
        *,
        gpu: Any = None,  # GPUCollector: .latest() -> Mapping[int, GPUSample]
        process: Any = None,  # ProcessCollector: .latest() -> ProcessSample | None
        quality: QualitySource | None = None,
        clock: Callable[[], float] = time.monotonic,
        history_s: float = 7200.0,
        replica: str | None = None,  # this process's replica id, the `replica` label of its readings
        remote: Callable[[], Sequence[RemoteResources]] | None = None,
    ) -> None:
        self.stats = stats
        self.gpu = gpu
        self.process = process
        self.replica = replica
        self.remote = remote
        self.quality = quality
        self.clock = clock
        self.history_s = history_s
        self._lock = threading.Lock()
        self._memory: dict[tuple[str, ...], deque[tuple[float, float]]] = defaultdict(deque)

    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        kind = signal.kind
        if kind in ("latency_quantile", "error_rate", "request_rate", "queue_depth"):
            return self._inference(signal, by)
        if kind in ("gpu_sm_activity", "gpu_memory_ratio"):
            return self._gpu(signal, by)
        if kind == "memory_slope":
            return self._slope(signal, by)
        if kind in ("drift_p_value", "length_drift", "relevance"):
            return self._quality(signal, by)
        raise UnknownSignal(f"LiveSignals does not serve {kind!r} (a StoreSignals does)")

    def _inference(self, s: Signal, by: Sequence[str]) -> list[Sample]:
        if self.stats is None:
            return []
        out = []
        for model, version in sorted(_keys(by, self.stats.labels()), key=str):
            value: float | None
            if s.kind == "latency_quantile":
                assert s.metric is not None and s.quantile is not None and s.window_s is not None
                value = self.stats.quantile(
                    s.metric, s.quantile, s.window_s, model=model, model_version=version
                )
            elif s.kind == "queue_depth":
                value = float(self.stats.waiting(model=model, model_version=version))
            else:
                assert s.window_s is not None
                total = self.stats.count(s.window_s, model=model, model_version=version)
                if s.kind == "request_rate":
                    value = total / s.window_s
                elif total == 0 or total < (s.min_requests or 1):
                    value = None
                else:
                    errors = self.stats.count(
                        s.window_s, model=model, model_version=version, errors_only=True
                    )
                    value = errors / total
            if value is not None:
                out.append(Sample.of(value, **_labels(by, model, version)))
        return out

    def _readings(self) -> list[tuple[str | None, Mapping[int, Any], Any]]:
        """(replica, GPUs by index, process sample) of this process, then of the others."""
        out: list[tuple[str | None, Mapping[int, Any], Any]] = [
            (
                self.replica,
                self.gpu.latest() if self.gpu is not None else {},
                self.process.latest() if self.process is not None else None,
            )
        ]
        if self.remote is not None:
            out += [(r.replica, r.gpus, r.process) for r in self.remote() if r.replica != self.replica]
        return out

    @staticmethod
    def _with_replica(labels: dict[str, str], replica: str | None) -> dict[str, str]:
        return {**labels, "replica": replica} if replica is not None else labels

    def _gpu(self, s: Signal, by: Sequence[str]) -> list[Sample]:
        groups: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(list)
        for replica, gpus, _ in self._readings():
            for index, g in sorted(gpus.items()):
                if s.kind == "gpu_sm_activity":
                    value = g.sm_activity
                elif g.memory_used_bytes is None or not g.memory_total_bytes:
                    value = None
                else:
                    value = g.memory_used_bytes / g.memory_total_bytes
                if value is not None:
                    labels = self._with_replica({"gpu": str(index), "uuid": g.uuid}, replica)
                    groups[tuple((k, v) for k, v in sorted(labels.items()) if k in by)].append(float(value))
        return [Sample(k, sum(v) / len(v)) for k, v in sorted(groups.items())]

    def _remember(self, key: tuple[str, ...], value: float) -> list[tuple[float, float]]:
        now = self.clock()
        with self._lock:
            points = self._memory[key]
            if not points or points[-1][0] < now:
                points.append((now, value))
            while points and points[0][0] < now - self.history_s:
                points.popleft()
            return list(points)

    def _slope(self, s: Signal, by: Sequence[str]) -> list[Sample]:
        assert s.window_s is not None
        readings: list[tuple[dict[str, str], float]] = []
        for replica, gpus, p in self._readings():
            if s.resource == "gpu":
                for index, g in sorted(gpus.items()):
                    if g.memory_used_bytes is not None:
                        labels = self._with_replica({"gpu": str(index), "uuid": g.uuid}, replica)
                        readings.append((labels, float(g.memory_used_bytes)))
            elif s.resource == "process" and p is not None:
                readings.append((self._with_replica({"pid": str(p.pid)}, replica), float(p.rss_bytes)))
        out = []
        for labels, value in readings:
            points = self._remember((s.resource or "", *sorted(labels.items())), value)  # type: ignore[arg-type]
            now = points[-1][0]
            recent = [p for p in points if p[0] >= now - s.window_s]
            slope = least_squares_slope(recent)
            if slope is not None and len(recent) >= 3:
                out.append(Sample(tuple((k, v) for k, v in sorted(labels.items()) if k in by), slope * 60.0))
        return out

    def _quality(self, s: Signal, by: Sequence[str]) -> list[Sample]:
        if self.quality is None:
            return []
        if s.kind == "drift_p_value":
            assert s.field is not None
            values = self.quality.drift_p_values(s.field)
            pick = min  # the strongest evidence of drift among merged versions
        elif s.kind == "length_drift":
            assert s.field is not None
            values = self.quality.length_p_values(s.field)
            pick = min
        else:
            values = self.quality.relevance_means()
            pick = min
        merged: dict[tuple[tuple[str, str], ...], float] = {}
        for (model, version), value in values.items():
            key = tuple(sorted(_labels(by, model, version).items()))
            merged[key] = pick(value, merged.get(key, value))
        return [Sample(k, v) for k, v in sorted(merged.items())]
