"""Where every observed call goes: the SDK's batches (ingest), the upstream proxy and the
embedded runtime's OpenAI endpoints all hand `InferenceRecord`s to one `RecordPipeline`.

It queues the rows for the group-commit writer (raising `IngestOverloaded` before anything
else happens when the store is behind), lets each observer see each record (the live
statistics the alert engine and the page read), and offers the texts to the embedding
reservoir. An observer's exception is counted and swallowed: one bad observer never
loses a batch. Texts are offered under the label set the live statistics record them
under (`label_set`: `other` past the label value cap), so that the drift state kept per
model version stays as bounded as /metrics; the stored rows keep the names as sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol

from infersight.monitor.records import InferenceRecord

from .metrics import ServiceMetrics
from .reservoir import SampledText, TextReservoir
from .writer import RequestWriter

__all__ = ["RecordObserver", "RecordPipeline"]

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
        future = self.writer.submit(records)  # may raise IngestOverloaded: nothing else happened
        for observer in [*(self.observers if observe else ()), *self.ledgers]:
            try:
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

    def _labels(self, record: InferenceRecord) -> tuple[str, str]:
        if self.label_set is None:
            return record.model, record.model_version
        try:
            return self.label_set(record.model, record.model_version)
        except Exception:  # names the statistics refuse: offered as they are, like before
            return record.model, record.model_version
