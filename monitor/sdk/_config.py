"""What the SDK accepts and what it reports about itself: its options (`SDKConfig`, validated
once, swapped whole by `configure()`), the prompt and response text (default extractors,
and the checks, redaction and truncation applied on the delivery thread before a record
leaves the process), its own counters (exported from the monitor's registry; an increment
is `Tally.incr()`, one C call and no lock, so counting a dropped record on a full queue
costs the caller next to nothing), and its errors:

```
SDKError                        base of everything raised here
├── SDKConfigError (ValueError) a bad option given to Monitor, configure() or track()
└── SinkError                   a batch could not be delivered (raised by sinks, caught
    │                           by the delivery thread and counted as
    │                           infersight_sdk_records_dropped_total{reason="sink_error"})
    ├── SinkRejected            the receiver refused the batch (HTTP 4xx): not retried
    └── SinkUnavailable         the receiver could not be reached or kept failing (5xx,
                                429, connection errors) after every retry
```

Only `SDKConfigError` ever reaches user code, and only from set-up calls (`Monitor(...)`,
`configure(...)`, `track(...)` with bad options), never from a tracked call: the
decorator records, counts and re-raises the user's own exceptions unchanged, and
swallows (and counts) its own.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from infersight.collectors import Tally, register_fork_handler
from infersight.monitor.records import MAX_TEXT_CHARS, InferenceRecord
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = [
    "DROP_REASONS",
    "NON_STRING",
    "REJECT_REASONS",
    "SDKConfig",
    "SDKConfigError",
    "SDKCounters",
    "SDKError",
    "Sink",
    "SinkError",
    "SinkRejected",
    "SinkUnavailable",
    "check_sample_rate",
    "default_prompt",
    "default_response",
    "prepare_text",
]


class SDKError(Exception):
    """Base class of the errors raised by infersight.monitor.sdk."""


class SDKConfigError(SDKError, ValueError):
    """A bad option for Monitor, configure() or track(); the message names it."""


class SinkError(SDKError):
    """A batch of records could not be delivered."""


class SinkRejected(SinkError):
    """The receiver refused the batch (HTTP 4xx other than 429); retrying would not help."""


class SinkUnavailable(SinkError):
    """The receiver could not be reached, or kept failing, after every retry."""


NON_STRING = object()  # what the hot path keeps when an extractor returned a non-string


def default_prompt(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The first positional `str` argument, else a `prompt=` keyword (None: no prompt)."""
    for arg in args:
        if isinstance(arg, str):
            return arg
    return kwargs.get("prompt")


def default_response(result: Any) -> Any:
    """A `str` result as is; for a stream (the list of yielded items) the items joined
    when they are all strings. Anything else: None (no response text)."""
    if isinstance(result, str):
        return result
    if isinstance(result, list) and all(isinstance(x, str) for x in result):
        return "".join(result)
    return None


def prepare_text(
    text: str,
    *,
    max_text_chars: int,
    max_payload_chars: int,
    redact: Callable[[str], str] | None,
) -> tuple[str | None, str | None]:
    """`(text to send, rejection or truncation reason)`: a text longer than
    `max_payload_chars` is rejected (`payload_too_large`); a redactor that fails or
    returns a non-string drops the text (`redaction_failed`): unredacted text never
    leaves; a text longer than `max_text_chars` is cut (`truncated`)."""
    if len(text) > max_payload_chars:
        return None, "payload_too_large"
    if redact is not None:
        try:
            text = redact(text)
        except Exception:
            return None, "redaction_failed"
        if not isinstance(text, str):
            return None, "redaction_failed"
    if len(text) > max_text_chars:
        return text[:max_text_chars], "truncated"
    return text, None


# A sink takes one batch; it returns how many records the receiver refused (None: none).
Sink = Callable[[Sequence[InferenceRecord]], int | None]


@dataclass(frozen=True)
class SDKConfig:
    sink: Sink | None = None
    sample_rate: float = 0.0  # fraction of calls whose prompt and response are sent to the sink
    extract_prompt: Callable[[tuple[Any, ...], dict[str, Any]], Any] = default_prompt
    extract_response: Callable[[Any], Any] = default_response
    redact: Callable[[str], str] | None = None  # runs on the delivery thread, before truncation
    max_text_chars: int = 4096  # longer prompt/response text is truncated (counted)
    max_payload_chars: int = 1_000_000  # longer text is rejected outright (counted)
    queue_size: int = 10_000  # sampled records waiting for delivery; a full queue drops
    batch_size: int = 100
    flush_interval_s: float = 1.0
    exit_timeout_s: float = 2.0  # how long interpreter exit waits for the last flush

    def __post_init__(self) -> None:
        check_sample_rate(self.sample_rate)
        if self.sample_rate > 0 and self.sink is None:
            raise SDKConfigError("sample_rate > 0 needs a sink (a callable or HttpSink) to send records to")
        if self.sink is not None and not callable(self.sink):
            raise SDKConfigError(f"sink must be callable, got {type(self.sink).__name__}")
        for name in ("extract_prompt", "extract_response"):
            if not callable(getattr(self, name)):
                raise SDKConfigError(f"{name} must be callable")
        if self.redact is not None and not callable(self.redact):
            raise SDKConfigError("redact must be callable or None")
        if not 1 <= self.max_text_chars <= MAX_TEXT_CHARS:
            raise SDKConfigError(
                f"max_text_chars must be in [1, {MAX_TEXT_CHARS}], got {self.max_text_chars!r}"
            )
        if self.max_payload_chars < self.max_text_chars:
            raise SDKConfigError("max_payload_chars must be >= max_text_chars")
        for name in ("queue_size", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SDKConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("flush_interval_s", "exit_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise SDKConfigError(f"{name} must be a positive number of seconds, got {value!r}")

    def with_changes(self, **changes: Any) -> SDKConfig:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise SDKConfigError(f"unknown option {unknown[0]!r}; valid: {', '.join(sorted(known))}")
        return replace(self, **changes)


def check_sample_rate(rate: object) -> None:
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
        raise SDKConfigError(f"sample_rate must be a number in [0, 1], got {rate!r}")


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
