"""The signals a rule can watch, and the one protocol through which they are read.

A signal is structured, not a query string: `{kind: latency_quantile, metric:
request_duration, quantile: 0.99, window: 5m}`. Each kind names the labels it can be
split by (`by`), the parameters it takes, and whether Prometheus can compute it
(see `promql.py`). `SIGNAL_KINDS` is the explicit table; an unknown kind lists the valid ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..errors import UnknownSignal

__all__ = ["LATENCY_METRICS", "SIGNAL_KINDS", "Sample", "Signal", "SignalKind", "SignalSource"]

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
