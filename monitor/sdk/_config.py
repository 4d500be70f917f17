"""The SDK's options, validated once, swapped whole by `configure()`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from infersight.monitor.records import MAX_TEXT_CHARS, InferenceRecord

from ._payload import default_prompt, default_response
from .errors import SDKConfigError

__all__ = ["SDKConfig", "Sink", "check_sample_rate"]

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
