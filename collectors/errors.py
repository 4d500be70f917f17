"""Errors raised by infersight.collectors.

```
CollectorError                      base of everything raised here
├── NVMLUnavailable                 the NVML library or driver cannot be used (reason in the message)
├── InvalidObservation (ValueError) a NaN, negative or non-numeric value handed to InferenceStats
└── InvalidQuery (ValueError)       a query the statistics cannot answer
    ├── UnknownMetric               a metric name outside request_duration, ttft, tpot, queue_time
    └── WindowTooLong               a window longer than the history kept
```

The collectors never raise into a scrape or into serving: a failing NVML or psutil call
is counted (`infersight_nvml_errors_total{function}`) and its value left out. These
errors are for the caller who hands bad input to a query or an observation.
"""

from __future__ import annotations

__all__ = [
    "CollectorError",
    "InvalidObservation",
    "InvalidQuery",
    "NVMLUnavailable",
    "UnknownMetric",
    "WindowTooLong",
]


class CollectorError(Exception):
    """Base class of the errors raised by infersight.collectors."""


class NVMLUnavailable(CollectorError):
    """NVML cannot be used here: no pynvml, no driver library, no device, or init failed."""


class InvalidObservation(CollectorError, ValueError):
    """A value handed to `InferenceStats` is NaN, negative or not a number.

    `field` names the value; `reason` is the counted rejection reason
    (`nan_duration`, `negative_duration`, `invalid_number`, `invalid_count`, `invalid_label`).
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class InvalidQuery(CollectorError, ValueError):
    """A query the statistics cannot answer (a quantile outside [0, 1], a window <= 0)."""


class UnknownMetric(InvalidQuery):
    """A metric name the statistics do not keep; the message lists the valid ones."""


class WindowTooLong(InvalidQuery):
    """A window longer than the history the statistics keep."""
