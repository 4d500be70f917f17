"""The record pipeline: timing a call into an `InferenceRecord`, handing it to the observers,
the group-commit writer and the embedding reservoir.

Where every observed call goes: the SDK's batches (ingest), the upstream proxy and the
embedded runtime's OpenAI endpoints all hand `InferenceRecord`s to one `RecordPipeline`.

It queues the rows for the group-commit writer (raising `IngestOverloaded` before anything
else happens when the store is behind), lets each observer see each record (the live
statistics the alert engine and the page read), and offers the texts to the embedding
reservoir. An observer's exception is counted and swallowed: one bad observer never
loses a batch. Texts are offered under the label set the live statistics record them
under (`label_set`: `other` past the label value cap), so that the drift state kept per
model version stays as bounded as /metrics; the stored rows keep the names as sent.

Timing one served or proxied call and turning it into an `InferenceRecord`.

A bounded reservoir of texts awaiting embedding, so drift scoring never falls behind
silently: between two drains at most `capacity` texts are kept, a uniform random sample
of all offered (Vitter's algorithm R); the others are counted as skipped.

The rows are written by the store's group-commit writer (`infersight.monitor.store.writer`):
its bounded queue refusing a batch (`WriteQueueFull`) is this service's `IngestOverloaded`."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from infersight.monitor.records import FINISH_REASONS, MAX_TEXT_CHARS, InferenceRecord, RecordSource
from infersight.monitor.store.writer import RequestWriter, WriteQueueFull

from .errors import IngestOverloaded
from .metrics import ServiceMetrics

__all__ = [
    "CallTimer",
    "RecordObserver",
    "RecordPipeline",
    "SampledText",
    "TextReservoir",
    "make_record",
]

log = logging.getLogger(__name__)


class RecordObserver(Protocol):
    def observe(self, record: InferenceRecord) -> None: ...


class RecordPipeline:
    def __init__(
        self,
        writer: RequestWriter,
        metrics: ServiceMetrics,
        *,
        observers: Sequence[RecordObserver] = (),
        reservoir: TextReservoir | None = None,
    ) -> None:
        self.writer = writer
        self.metrics = metrics
        self.observers = list(observers)
        self.ledgers: list[RecordObserver] = []  # see every record, whatever `observe` says
        self.reservoir = reservoir
        self.label_set: Callable[[str, str], tuple[str, str]] | None = None

    def add_observer(self, observer: RecordObserver, *, every_record: bool = False) -> None:
        """`every_record`: also the calls the live statistics saw directly (SLO ledger, cost)."""
        (self.ledgers if every_record else self.observers).append(observer)

    def submit(self, records: Sequence[InferenceRecord], *, observe: bool = True) -> Future[int]:
        """Store, observe and offer `records`. `observe=False` when the live statistics
        already saw these calls (the embedded runtime's events feed them directly)."""
        try:
            future = self.writer.submit(records)
        except WriteQueueFull as exc:  # nothing else happened
            raise IngestOverloaded(str(exc)) from exc
        for observer in [*(self.observers if observe else ()), *self.ledgers]:
            try:
                observe_many = getattr(observer, "observe_many", None)
                if observe_many is not None:  # the batch in one pass (the live statistics)
                    observe_many(records)
                else:
                    for record in records:
                        observer.observe(record)
            except Exception as exc:  # an observer must never lose the batch
                self.metrics.observer_errors.labels(type(observer).__name__).inc()
                log.warning("record observer %s failed: %s", type(observer).__name__, exc)
        if self.reservoir is not None:
            offered = 0
            for r in records:
                if r.prompt is not None or r.response is not None:
                    offered += 1
                    model, version = self._labels(r)
                    self.reservoir.offer(
                        SampledText(r.request_id, model, version, r.started_at, r.prompt, r.response)
                    )
            if offered:
                self.metrics.texts_offered.inc(offered)
        self.metrics.store_write_queue.set(self.writer.queued_rows)
        return future

    def submit_one(self, record: InferenceRecord, *, observe: bool = True) -> None:
        """Hand one observed call (served or proxied) over; a full store queue drops it,
        counted as `dropped`: the client's answer never waits on the store."""
        try:
            self.submit([record], observe=observe)
        except IngestOverloaded:
            self.metrics.ingest_events.labels("dropped").inc()

    def _labels(self, record: InferenceRecord) -> tuple[str, str]:
        if self.label_set is None:
            return record.model, record.model_version
        try:
            return self.label_set(record.model, record.model_version)
        except Exception:  # names the statistics refuse: offered as they are, like before
            return record.model, record.model_version


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
    max_tokens: int | None = None,
    stream: bool | None = None,
    finish_reason: str | None = None,
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
        max_tokens=max_tokens if max_tokens is not None and 1 <= max_tokens < 2**31 else None,
        stream=stream,
        finish_reason=finish_reason if finish_reason is None or finish_reason in FINISH_REASONS else "other",
    )


@dataclass(frozen=True, slots=True)
class SampledText:
    request_id: str
    model: str
    model_version: str
    started_at: float
    prompt: str | None
    response: str | None


class TextReservoir:
    def __init__(
        self,
        capacity: int,
        *,
        on_skip: Callable[[int], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._items: list[SampledText] = []
        self._seen = 0  # offered since the last drain
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._on_skip = on_skip
        self.offered_total = 0
        self.skipped_total = 0

    def offer(self, item: SampledText) -> None:
        skipped = 0
        with self._lock:
            self._seen += 1
            self.offered_total += 1
            if len(self._items) < self.capacity:
                self._items.append(item)
            else:
                j = self._rng.randrange(self._seen)
                if j < self.capacity:
                    self._items[j] = item
                skipped = 1  # one text (the new one or the one it replaced) will not be embedded
                self.skipped_total += 1
        if skipped and self._on_skip is not None:
            self._on_skip(skipped)

    def drain(self) -> list[SampledText]:
        with self._lock:
            items, self._items, self._seen = self._items, [], 0
        return items

    def resize(self, capacity: int) -> None:
        """Keep at most `capacity` texts from now on (the embed job's budget, wiring_drift.py);
        texts already held beyond it are dropped at random, counted as skipped."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        dropped = 0
        with self._lock:
            if len(self._items) > capacity:
                dropped = len(self._items) - capacity
                self._items = self._rng.sample(self._items, capacity)
                self.skipped_total += dropped
            self.capacity = capacity
        if dropped and self._on_skip is not None:
            self._on_skip(dropped)

    def __len__(self) -> int:
        return len(self._items)
