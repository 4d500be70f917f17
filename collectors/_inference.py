"""InferenceStats: per-(model, model_version) request statistics for Prometheus and for
the alert engine.

Two views of the same observations:
- Prometheus histograms and counters (names in docs/architecture.md), served by this
  object's `collect()` from the registry it was given;
- sliding-window DDSketches with a stated relative accuracy, queried in process:
  `quantile("request_duration", 0.99, window_s=300)`, `count(300, errors_only=True)`.

Recording is an append, without a lock (`Series`, in `_recording`); folding happens at
scrape or query time, so the cost of the sketches is paid off the caller's path.

Label values come from clients (an SDK's model name, the `model` a proxied client sends),
so each label keeps at most `max_label_values` distinct values, and there are at most
`max_label_values` (model, model_version) combinations of such values (100 models times
100 versions would otherwise be 10,000 series): a value past that is recorded as `other`,
a combination past that as (`other`, `other`), and each such observation is counted in
`infersight_label_values_overflowed_total{label}` (label: model, model_version, series).
Nothing is lost from the aggregates, and neither /metrics nor the sketch windows grow
with the number of names clients invent. Names the operator controls (the embedded
runtime's registered versions) are `trusted`: never capped, never counted.

Values handed in by code we do not control are validated (`check_seconds`, `check_count`,
`check_label`) and refused with `InvalidObservation`.

Serving a registry at /metrics is in `_exposition`.

The metric families of `InferenceStats` (names: docs/architecture.md) are built here at
scrape time (`inference_families`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from ddsketch import DDSketch
from infersight.monitor.records import CANCELLED, CLIENT_ERROR, CLIENT_OUTCOMES, InferenceRecord
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ._recording import Pending, Series, check_count, check_label, check_seconds, fold_pending, observations
from ._series import LATENCY_METRICS, WindowedSketches, register_fork_handler
from .errors import InvalidObservation, InvalidQuery, UnknownMetric, WindowTooLong

__all__ = [
    "HISTOGRAM_NAMES",
    "OVERFLOW_LABEL_VALUE",
    "InferenceStats",
    "describe_families",
    "inference_families",
]


_LABELS = ["model", "model_version"]

HISTOGRAM_NAMES = {
    "request_duration": (
        "gen_ai_server_request_duration_seconds",
        "End-to-end request latency, including failed requests.",
    ),
    "ttft": ("gen_ai_server_time_to_first_token_seconds", "Time to first output token (streaming calls)."),
    "tpot": (
        "gen_ai_server_time_per_output_token_seconds",
        "Mean time per output token after the first, per request.",
    ),
    "queue_time": ("gen_ai_server_request_queue_time_seconds", "Time queued before scheduling."),
}
_TOKENS = ("gen_ai_server_token_usage", "Tokens per request, by gen_ai_token_type (input, output).")
_IN_FLIGHT = ("gen_ai_server_requests_in_flight", "Requests started and not yet finished.")
_WAITING = ("gen_ai_server_requests_waiting", "Requests queued, not yet scheduled.")
_ERRORS = (
    "gen_ai_server_request_errors",
    "Requests failed by the server, by error_type (the exception's class name).",
)
_CLIENT = (
    "infersight_client_outcomes",
    "Requests that ended without a server error: outcome client_error (refused: e.g. an over-long "
    "prompt, an upstream 4xx), cancelled (the client hung up), shed (refused with 503 by SLA "
    "routing's length breaker) or overloaded (refused with 429 by admission control).",
)


def _empty() -> list[Metric]:
    families: list[Metric] = [
        HistogramMetricFamily(name, doc, labels=_LABELS) for name, doc in HISTOGRAM_NAMES.values()
    ]
    families.append(HistogramMetricFamily(*_TOKENS, labels=[*_LABELS, "gen_ai_token_type"]))
    families.append(GaugeMetricFamily(*_IN_FLIGHT, labels=_LABELS))
    families.append(GaugeMetricFamily(*_WAITING, labels=_LABELS))
    families.append(CounterMetricFamily(*_ERRORS, labels=[*_LABELS, "error_type"]))
    families.append(CounterMetricFamily(*_CLIENT, labels=[*_LABELS, "outcome"]))
    return families


def describe_families() -> list[Metric]:
    return _empty()


def inference_families(series: Sequence[Series], in_flight: dict[int, int]) -> list[Metric]:
    families = _empty()
    by_name = {f.name: f for f in families}
    for s in series:
        labels = [s.model, s.model_version]
        for metric, (name, _doc) in HISTOGRAM_NAMES.items():
            h = s.histograms[metric]
            fam = by_name[name]
            assert isinstance(fam, HistogramMetricFamily)
            fam.add_metric(labels, h.cumulative(), h.sum)
        tokens = by_name[_TOKENS[0]]
        assert isinstance(tokens, HistogramMetricFamily)
        for token_type, h in s.tokens.items():
            tokens.add_metric([*labels, token_type], h.cumulative(), h.sum)
        _gauge(by_name[_IN_FLIGHT[0]]).add_metric(labels, in_flight.get(id(s), 0))
        _gauge(by_name[_WAITING[0]]).add_metric(labels, s.waiting)
        errors = by_name[_ERRORS[0]]
        assert isinstance(errors, CounterMetricFamily)
        for error_type, n in sorted(s.errors.items()):
            errors.add_metric([*labels, error_type], n)
        client = by_name[_CLIENT[0]]
        assert isinstance(client, CounterMetricFamily)
        for outcome, n in sorted(s.client_outcomes.items()):
            client.add_metric([*labels, outcome], n)
    return families


def _gauge(family: Metric) -> GaugeMetricFamily:
    assert isinstance(family, GaugeMetricFamily)
    return family


OVERFLOW_LABEL_VALUE = "other"
_OTHER_SERIES = (OVERFLOW_LABEL_VALUE, OVERFLOW_LABEL_VALUE)
_OVERFLOW = (
    "infersight_label_values_overflowed",
    "Observations recorded under label value `other` because the label already had max_label_values values.",
)

_SLOT_COUNTS = {None: "total", CLIENT_ERROR: "client_errors", CANCELLED: "cancelled"}  # count(outcome=)


class InferenceStats(Collector):
    """Inference statistics; registers itself into `registry` (never the global one)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        window_s: float = 3600.0,
        interval_s: float = 10.0,
        relative_accuracy: float = 0.01,
        max_pending: int = 4096,
        max_label_values: int = 100,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 < relative_accuracy < 1:
            raise InvalidQuery(f"relative_accuracy must be in (0, 1), got {relative_accuracy!r}")
        if not 0 < interval_s <= window_s:
            raise InvalidQuery(f"need 0 < interval_s <= window_s, got {interval_s!r}, {window_s!r}")
        if max_label_values < 1:
            raise InvalidQuery(f"max_label_values must be >= 1, got {max_label_values!r}")
        self.max_label_values = max_label_values
        self._values: dict[str, set[str]] = {"model": set(), "model_version": set()}
        self._overflowed: dict[str, int] = {"model": 0, "model_version": 0, "series": 0}
        self._untrusted_series = 0
        self._window_s = float(window_s)
        self._interval_s = float(interval_s)
        self._alpha = float(relative_accuracy)
        self._max_pending = max_pending
        self.clock = clock
        self._series: dict[tuple[str, str], Series] = {}
        self._series_lock = threading.Lock()
        self._fold_lock = threading.Lock()
        register_fork_handler(self)
        if registry is not None:
            registry.register(self)

    @property
    def relative_accuracy(self) -> float:
        """The sketches' guarantee: a quantile is within this fraction of the exact value."""
        return self._alpha

    @property
    def window_s(self) -> float:
        """The longest window a query may ask for."""
        return self._window_s

    @property
    def interval_s(self) -> float:
        """The length of one interval of the sliding windows."""
        return self._interval_s

    # -- recording ------------------------------------------------------------------
    def series(self, model: str, model_version: str, *, trusted: bool = False) -> Series:
        """The handle for one label set (created on first use, then exported with zeros).
        `trusted`: names the operator controls (the embedded runtime's registered versions),
        neither capped nor counted against the cap."""
        key = (model, model_version)
        found = self._series.get(key)
        if found is not None:
            return found
        check_label("model", model)
        check_label("model_version", model_version)
        with self._series_lock:
            if not trusted:
                key = (self._capped("model", model), self._capped("model_version", model_version))
                if key not in self._series:
                    if self._untrusted_series >= self.max_label_values and key != _OTHER_SERIES:
                        self._overflowed["series"] += 1
                        key = _OTHER_SERIES
                    if key not in self._series:
                        self._untrusted_series += 1
                model, model_version = key
            found = self._series.get(key)
            if found is None:
                windows = WindowedSketches(
                    relative_accuracy=self._alpha, interval_s=self._interval_s, window_s=self._window_s
                )
                found = Series(
                    model, model_version, windows=windows, max_pending=self._max_pending, fold=self._fold_one
                )
                self._series[key] = found
        return found

    def label_set(self, model: str, model_version: str) -> tuple[str, str]:
        """The (model, model_version) an observation with these names is recorded under
        (`other` past the cap): what other in-memory state keyed by them should use."""
        series = self.series(model, model_version)
        return series.model, series.model_version

    def _capped(self, label: str, value: str) -> str:
        """`value`, or `other` once the label has its maximum of distinct values (lock held)."""
        seen = self._values[label]
        if value in seen:
            return value
        if len(seen) < self.max_label_values:
            seen.add(value)
            return value
        self._overflowed[label] += 1
        return OVERFLOW_LABEL_VALUE

    def observe(self, record: InferenceRecord) -> None:
        """Add one finished request (the engine adapter, the ingest endpoint)."""
        self.add(
            model=record.model,
            model_version=record.model_version,
            duration_s=record.duration_s,
            ttft_s=record.ttft_s,
            tpot_s=record.tpot_s,
            queue_s=record.queue_s,
            prompt_tokens=record.prompt_tokens,
            output_tokens=record.output_tokens,
            error_type=record.error_type,
        )

    def observe_many(self, records: Iterable[InferenceRecord]) -> None:
        """Add finished requests in one pass (an ingest batch), checked as `add` checks them:
        a bad one is left out and, once the others are added, raised (`InvalidObservation`)."""
        groups, error = observations(records, self.clock())
        for (model, model_version), rows in groups.items():
            try:
                series = self.series(model, model_version)
            except InvalidObservation as exc:  # a bad model name: its rows are left out
                error = error or exc
                continue
            series.add_many(rows)
        if error is not None:
            raise error

    def add(
        self,
        *,
        model: str,
        model_version: str,
        duration_s: float,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        queue_s: float | None = None,
        prompt_tokens: int | None = None,
        output_tokens: int | None = None,
        error_type: str | None = None,
    ) -> None:
        """Validated manual observation; raises `InvalidObservation` naming the field."""
        duration = check_seconds("duration_s", duration_s, required=True)
        assert duration is not None  # required=True raises instead
        observation: Pending = (
            self.clock(),
            duration,
            check_seconds("ttft_s", ttft_s),
            check_seconds("tpot_s", tpot_s),
            check_seconds("queue_s", queue_s),
            check_count("prompt_tokens", prompt_tokens),
            check_count("output_tokens", output_tokens),
            None if error_type is None else check_label("error_type", error_type),
        )
        self.series(model, model_version).add(observation)

    # -- queries (the alert engine) ---------------------------------------------------
    def quantile(
        self,
        metric: str,
        q: float,
        window_s: float,
        *,
        model: str | None = None,
        model_version: str | None = None,
    ) -> float | None:
        """The q-quantile (seconds) of `metric` over the last `window_s`; None: no data."""
        if metric not in LATENCY_METRICS:
            raise UnknownMetric(f"unknown metric {metric!r}; valid: {', '.join(LATENCY_METRICS)}")
        if not 0.0 <= q <= 1.0:
            raise InvalidQuery(f"quantile must be in [0, 1], got {q!r}")
        merged = self.sketch(metric, window_s, model=model, model_version=model_version)
        value = merged.get_quantile_value(q)
        return None if value is None else float(value)

    def sketch(
        self, metric: str, window_s: float, *, model: str | None = None, model_version: str | None = None
    ) -> DDSketch:
        """A new sketch of `metric` over the last `window_s` (merge others into it)."""
        self._check_window(window_s)
        merged = DDSketch(self._alpha)
        with self._fold_lock:
            now = self.clock()
            for series in self._fold_matching(model, model_version, now):
                series.windows.merged(metric, now, window_s, merged)
        return merged

    def count(
        self,
        window_s: float,
        *,
        model: str | None = None,
        model_version: str | None = None,
        errors_only: bool = False,
        outcome: str | None = None,
    ) -> int:
        """Requests that finished in the last `window_s`: all of them, those the server
        failed (`errors_only`), or those with a client `outcome` (client_error, cancelled)."""
        self._check_window(window_s)
        if outcome is not None and outcome not in CLIENT_OUTCOMES:
            raise InvalidQuery(
                f"outcome must be one of {', '.join(sorted(CLIENT_OUTCOMES))}, got {outcome!r}"
            )
        attr = "errors" if errors_only else _SLOT_COUNTS[outcome]
        total = 0
        with self._fold_lock:
            now = self.clock()
            for series in self._fold_matching(model, model_version, now):
                for slot in series.windows.recent(now, window_s):
                    total += getattr(slot, attr)
        return total

    def error_counts(self, *, model: str | None = None, model_version: str | None = None) -> dict[str, int]:
        """Requests failed by the server, by error type, since start (the Prometheus
        counter's values; the client's outcomes are in `client_outcome_counts`)."""
        totals: dict[str, int] = {}
        with self._fold_lock:
            for series in self._fold_matching(model, model_version, self.clock()):
                for error_type, n in series.errors.items():
                    totals[error_type] = totals.get(error_type, 0) + n
        return totals

    def client_outcome_counts(
        self, *, model: str | None = None, model_version: str | None = None
    ) -> dict[str, int]:
        """Requests that ended without a server error (client_error, cancelled, shed) since
        start."""
        totals: dict[str, int] = {}
        with self._fold_lock:
            for series in self._fold_matching(model, model_version, self.clock()):
                for outcome, n in series.client_outcomes.items():
                    totals[outcome] = totals.get(outcome, 0) + n
        return totals

    def labels(self) -> list[tuple[str, str]]:
        """Every (model, model_version) seen, in creation order."""
        return list(self._series)

    def in_flight(self, *, model: str | None = None, model_version: str | None = None) -> int:
        with self._fold_lock:
            return sum(s.in_flight() for s in self._matching(model, model_version))

    def waiting(self, *, model: str | None = None, model_version: str | None = None) -> int:
        return sum(s.waiting for s in self._matching(model, model_version))

    def window_slots(
        self, unchanged: Callable[[str, str, int, int, int], bool]
    ) -> list[tuple[str, str, int, int, int, dict[str, DDSketch] | None]]:
        """Every interval kept: (model, model_version, index on the stats clock, total,
        errors, copies of its sketches), the sketches None where `unchanged(model,
        model_version, index, total, errors)` says the caller has them already."""
        out: list[tuple[str, str, int, int, int, dict[str, DDSketch] | None]] = []
        with self._fold_lock:
            for series in self._fold_matching(None, None, self.clock()):
                for index, slot in sorted(series.windows.slots.items()):
                    m, v = series.model, series.model_version
                    if unchanged(m, v, index, slot.total, slot.errors):
                        out.append((m, v, index, slot.total, slot.errors, None))
                        continue
                    copies = {}
                    for metric, sketch in slot.sketches.items():
                        copies[metric] = DDSketch(self._alpha)
                        copies[metric].merge(sketch)
                    out.append((m, v, index, slot.total, slot.errors, copies))
        return out

    # -- Prometheus -------------------------------------------------------------------
    def describe(self) -> Iterable[Metric]:
        return [*describe_families(), CounterMetricFamily(*_OVERFLOW, labels=["label"])]

    def collect(self) -> Iterable[Metric]:
        with self._fold_lock:
            now = self.clock()
            series = list(self._fold_matching(None, None, now))
            in_flight = {id(s): s.in_flight() for s in series}
            families = inference_families(series, in_flight)
        overflow = CounterMetricFamily(*_OVERFLOW, labels=["label"])
        for label, n in self._overflowed.items():
            overflow.add_metric([label], n)
        return [*families, overflow]

    # -- internals ---------------------------------------------------------------------
    def _check_window(self, window_s: float) -> None:
        if not window_s > 0:
            raise InvalidQuery(f"window_s must be > 0, got {window_s!r}")
        if window_s > self._window_s:
            raise WindowTooLong(f"window {window_s:g}s is longer than the {self._window_s:g}s kept")

    def _matching(self, model: str | None, model_version: str | None) -> list[Series]:
        return [
            s
            for (m, v), s in list(self._series.items())
            if (model is None or m == model) and (model_version is None or v == model_version)
        ]

    def _fold_matching(self, model: str | None, model_version: str | None, now: float) -> list[Series]:
        matching = self._matching(model, model_version)
        for series in matching:
            fold_pending(series, self._interval_s)
            series.windows.evict(now)
        return matching

    def _fold_one(self, series: Series) -> None:
        with self._fold_lock:
            fold_pending(series, self._interval_s)
            series.windows.evict(self.clock())

    def _after_fork_in_child(self) -> None:
        self._series_lock = threading.Lock()
        self._fold_lock = threading.Lock()
        for series in self._series.values():
            series.reinit_lock()
