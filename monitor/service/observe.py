"""Timing one served or proxied call and turning it into an `InferenceRecord`."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from infersight.monitor.records import MAX_TEXT_CHARS, InferenceRecord, RecordSource

__all__ = ["CallTimer", "make_record"]


@dataclass
class CallTimer:
    """Wall-clock start, monotonic durations; `first()` at the first output token."""

    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    first_at: float | None = None
    end_at: float | None = None

    def first(self) -> None:
        if self.first_at is None:
            self.first_at = time.perf_counter()

    def finish(self) -> None:
        if self.end_at is None:
            self.end_at = time.perf_counter()

    @property
    def duration_s(self) -> float:
        return (self.end_at if self.end_at is not None else time.perf_counter()) - self.t0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.t0

    def tpot_s(self, output_tokens: int | None) -> float | None:
        if self.first_at is None or self.end_at is None or not output_tokens or output_tokens < 2:
            return None
        return (self.end_at - self.first_at) / (output_tokens - 1)


def make_record(
    *,
    request_id: str,
    model: str,
    model_version: str,
    timer: CallTimer,
    source: RecordSource,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    queue_s: float | None = None,
    error_type: str | None = None,
    prompt: str | None = None,
    response: str | None = None,
    text_sample_rate: float = 1.0,
    rng: random.Random | None = None,
    path: str | None = None,
    system_prompt: str | None = None,
) -> InferenceRecord:
    timer.finish()
    keep_text = text_sample_rate >= 1.0 or (rng or random).random() < text_sample_rate
    return InferenceRecord(
        request_id=request_id[:256],
        model=(model or "unknown")[:256],
        model_version=(model_version or "unknown")[:256],
        started_at=timer.started_at,
        duration_s=max(0.0, timer.duration_s),
        ttft_s=timer.ttft_s,
        tpot_s=timer.tpot_s(output_tokens),
        queue_s=queue_s,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        error_type=error_type[:256] if error_type else None,
        prompt=prompt[:MAX_TEXT_CHARS] if keep_text and prompt is not None else None,
        response=response[:MAX_TEXT_CHARS] if keep_text and response is not None else None,
        source=source,
        path=path,
        system_prompt=system_prompt[:MAX_TEXT_CHARS] if keep_text and system_prompt is not None else None,
    )
