"""The SDK's own counters, exported from the monitor's registry.

Increments are `Tally.incr()` (one C call, no lock), so counting a dropped record on
a full queue costs the caller next to nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from infersight.collectors import Tally, register_fork_handler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["DROP_REASONS", "REJECT_REASONS", "SDKCounters"]

DROP_REASONS = ("queue_full", "sink_error", "server_rejected")
REJECT_REASONS = (
    "nan_duration",
    "negative_duration",
    "infinite_duration",
    "missing_duration",
    "invalid_number",
    "invalid_count",
    "invalid_label",
    "non_string_payload",
    "payload_too_large",
    "redaction_failed",
)
_FAMILIES = {
    "dropped": (
        "infersight_sdk_records_dropped",
        "Sampled records lost before delivery, by reason.",
        "reason",
    ),
    "rejected": ("infersight_sdk_records_rejected", "Bad input refused by the SDK, by reason.", "reason"),
    "truncated": (
        "infersight_sdk_payloads_truncated",
        "Prompt/response texts cut to max_text_chars.",
        "field",
    ),
    "internal": (
        "infersight_sdk_internal_errors",
        "Failures inside the SDK's own bookkeeping (never raised into the call), by stage.",
        "stage",
    ),
}


class SDKCounters(Collector):
    def __init__(self, registry: CollectorRegistry | None, *, queue_depth: Callable[[], int]) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[tuple[str, str], Tally] = {}
        for reason in DROP_REASONS:
            self.tally("dropped", reason)
        for reason in REJECT_REASONS:
            self.tally("rejected", reason)
        for field in ("prompt", "response"):
            self.tally("truncated", field)
        self.sent = Tally()
        self._queue_depth = queue_depth
        register_fork_handler(self)
        if registry is not None:
            registry.register(self)

    def tally(self, family: str, label: str) -> Tally:
        key = (family, label)
        found = self._tallies.get(key)
        if found is None:
            with self._lock:
                found = self._tallies.setdefault(key, Tally())
        return found

    def count(self, family: str, label: str, n: int = 1) -> None:
        self.tally(family, label).add(n)

    def value(self, family: str, label: str) -> int:
        with self._lock:
            return self.tally(family, label).value() if (family, label) in self._tallies else 0

    def sent_total(self) -> int:
        with self._lock:
            return self.sent.value()

    def describe(self) -> Iterable[Metric]:
        return self._families({}, 0, 0)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            values = {key: t.value() for key, t in list(self._tallies.items())}
            sent = self.sent.value()
        return self._families(values, sent, self._queue_depth())

    def _families(self, values: dict[tuple[str, str], int], sent: int, depth: int) -> list[Metric]:
        out: list[Metric] = []
        for family, (name, doc, label) in _FAMILIES.items():
            metric = CounterMetricFamily(name, doc, labels=[label])
            for (fam, value_label), n in sorted(values.items()):
                if fam == family:
                    metric.add_metric([value_label], n)
            out.append(metric)
        sent_metric = CounterMetricFamily(
            "infersight_sdk_records_sent", "Sampled records delivered to the sink."
        )
        sent_metric.add_metric([], sent)
        queue = GaugeMetricFamily("infersight_sdk_queue_depth", "Sampled records waiting for delivery.")
        queue.add_metric([], depth)
        return [*out, sent_metric, queue]

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
