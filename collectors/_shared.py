"""Statistics shared between replicas: one process's sliding windows as records another
process can merge, and the merged view the alert engine reads.

Each replica turns the intervals of its `InferenceStats` windows into `SlotRecord`s on
the epoch clock (`SlotExporter`: only the intervals that changed since the last call),
and some store keeps them. `MergedStats` answers the same queries as `InferenceStats`
over this process's own windows plus the records of the others: DDSketches merge
exactly (the merged sketch is the sketch of the union), so a p99 over two replicas keeps
the relative accuracy of one. Request and error counts add up.

Interval indices: a process's stats clock (`perf_counter` by default) is turned into the
epoch clock by an offset in whole intervals, measured once, so an interval keeps its
index for the life of the exporter; across processes an interval may be placed one
interval early or late, as a window is anyway resolved to whole intervals.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

from ._inference import InferenceStats
from ._series import LATENCY_METRICS
from .errors import InvalidQuery, UnknownMetric

__all__ = ["MergedStats", "RemoteStats", "SlotExporter", "SlotRecord", "decode_sketch", "encode_sketch"]


def encode_sketch(sketch: DDSketch) -> dict[str, Any]:
    """The bins of a sketch of non-negative values: `{"zero": n, "bins": [[key, count], ...]}`."""
    store = sketch._store  # ddsketch keeps no public accessor for the bins
    bins = [[store.offset + i, c] for i, c in enumerate(store.bins) if c]
    return {"zero": sketch._zero_count, "bins": bins}


def decode_sketch(data: Mapping[str, Any], relative_accuracy: float) -> DDSketch:
    """The sketch `encode_sketch` described: every bin back at its own key."""
    sketch = DDSketch(relative_accuracy)
    mapping = LogarithmicMapping(relative_accuracy)
    zero = float(data.get("zero", 0.0))
    if zero:
        sketch.add(0.0, zero)
    for key, count in data.get("bins", []):
        sketch.add(mapping.value(int(key)), float(count))
    return sketch


@dataclass(frozen=True)
class SlotRecord:
    """One interval of one (model, model_version) series of one replica."""

    model: str
    model_version: str
    slot: int  # floor(epoch seconds / interval_s) of the interval's start
    interval_s: float
    total: int
    errors: int
    sketches: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # metric -> encode_sketch()
    replica: str = ""

    def sketches_json(self) -> str:
        return json.dumps(self.sketches, separators=(",", ":"))


@dataclass(frozen=True)
class RemoteStats:
    """What the other replicas published: their intervals, and their queue depths now."""

    slots: Sequence[SlotRecord] = ()
    waiting: Mapping[tuple[str, str], int] = field(default_factory=dict)


class SlotExporter:
    """The intervals of `stats` that changed since the previous `changed()`."""

    def __init__(self, stats: InferenceStats, *, epoch_clock: Callable[[], float] = time.time) -> None:
        self.stats = stats
        self.epoch_clock = epoch_clock
        self._offset = round((epoch_clock() - stats.clock()) / stats.interval_s)
        self._sent: dict[tuple[str, str, int], tuple[int, int]] = {}

    def changed(self) -> list[SlotRecord]:
        out = []
        seen: set[tuple[str, str, int]] = set()
        for model, version, index, total, errors, sketches in self.stats.window_slots(
            lambda m, v, i, t, e: self._sent.get((m, v, i)) == (t, e)
        ):
            key = (model, version, index)
            seen.add(key)
            if sketches is None:
                continue
            out.append(SlotRecord(model, version, index + self._offset, self.stats.interval_s, total, errors,
                                  {m: encode_sketch(s) for m, s in sketches.items()}))  # fmt: skip
            self._sent[key] = (total, errors)
        for key in [k for k in self._sent if k not in seen]:  # evicted from the window
            del self._sent[key]
        return out


class MergedStats:
    """`InferenceStats`' query API over this process's windows and the other replicas'
    records (`remote()` is called once per query; cache it there)."""

    def __init__(
        self,
        local: InferenceStats,
        remote: Callable[[], RemoteStats],
        *,
        epoch_clock: Callable[[], float] = time.time,
    ) -> None:
        self.local = local
        self.remote = remote
        self.epoch_clock = epoch_clock
        self._decoded: dict[tuple[str, str, str, int, int, str], DDSketch] = {}
        self._lock = threading.Lock()

    @property
    def relative_accuracy(self) -> float:
        return self.local.relative_accuracy

    @property
    def window_s(self) -> float:
        return self.local.window_s

    def _recent(self, window_s: float, model: str | None, model_version: str | None) -> Iterable[SlotRecord]:
        first = math.floor((self.epoch_clock() - window_s) / self.local.interval_s)
        for r in self.remote().slots:
            if (
                r.slot >= first
                and (model is None or r.model == model)
                and (model_version is None or r.model_version == model_version)
            ):
                yield r

    def quantile(
        self, metric: str, q: float, window_s: float, *, model: str | None = None,
        model_version: str | None = None,
    ) -> float | None:  # fmt: skip
        if metric not in LATENCY_METRICS:
            raise UnknownMetric(f"unknown metric {metric!r}; valid: {', '.join(LATENCY_METRICS)}")
        if not 0.0 <= q <= 1.0:
            raise InvalidQuery(f"quantile must be in [0, 1], got {q!r}")
        merged = self.local.sketch(metric, window_s, model=model, model_version=model_version)
        for record in self._recent(window_s, model, model_version):
            data = record.sketches.get(metric)
            if data is not None:
                merged.merge(self._decode(record, metric, data))
        value = merged.get_quantile_value(q)
        return None if value is None else float(value)

    def _decode(self, record: SlotRecord, metric: str, data: Mapping[str, Any]) -> DDSketch:
        """Decoded once per published version of an interval (its total changes with it)."""
        key = (record.replica, record.model, record.model_version, record.slot, record.total, metric)
        with self._lock:
            found = self._decoded.get(key)
            if found is None:
                if len(self._decoded) > 50_000:
                    self._decoded.clear()
                found = self._decoded[key] = decode_sketch(data, self.local.relative_accuracy)
        return found

    def count(
        self, window_s: float, *, model: str | None = None, model_version: str | None = None,
        errors_only: bool = False,
    ) -> int:  # fmt: skip
        total = self.local.count(window_s, model=model, model_version=model_version, errors_only=errors_only)
        for r in self._recent(window_s, model, model_version):
            total += r.errors if errors_only else r.total
        return total

    def labels(self) -> list[tuple[str, str]]:
        out = list(self.local.labels())
        for r in self._recent(self.local.window_s, None, None):
            if (r.model, r.model_version) not in out:
                out.append((r.model, r.model_version))
        return out

    def waiting(self, *, model: str | None = None, model_version: str | None = None) -> int:
        n = self.local.waiting(model=model, model_version=model_version)
        for (m, v), w in self.remote().waiting.items():
            if (model is None or m == model) and (model_version is None or v == model_version):
                n += w
        return n
