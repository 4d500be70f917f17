"""A `SignalSource` whose values are set by hand (or pushed by another system): for
tests, benchmarks and signals infersight does not compute itself."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .signals import Sample, Signal, SignalSource

__all__ = ["StaticSignals"]


class StaticSignals(SignalSource):
    """Values per signal kind and label set. `read` keeps the labels named in `by`; label
    sets that collapse onto the same `by` values keep the largest value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}

    def set(self, kind: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values.setdefault(kind, {})[tuple(sorted(labels.items()))] = float(value)

    def clear(self, kind: str, **labels: str) -> None:
        with self._lock:
            if labels:
                self._values.get(kind, {}).pop(tuple(sorted(labels.items())), None)
            else:
                self._values.pop(kind, None)

    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        with self._lock:
            values = dict(self._values.get(signal.kind, {}))
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in values.items():
            key = tuple((k, v) for k, v in labels if k in by)
            out[key] = max(value, out.get(key, value))
        return [Sample(k, v) for k, v in sorted(out.items())]
