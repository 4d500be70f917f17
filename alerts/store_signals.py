"""Signals read from the database: the outbox's dead letters, mean relevance over the
window (what the service uses: the scored rows only, through a partial index), and — for
deployments that run without the collectors' live sketches — latency quantiles, error and
request rates computed exactly from the shared `requests` table over the window (these
read every request of the window: fine at modest rates, not at tens of thousands a
second)."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from infersight.monitor.records import is_server_error
from infersight.monitor.store.tables import requests
from sqlalchemy import Engine, func, select

from .errors import UnknownSignal
from .signals import Sample, Signal, SignalSource
from .tables import outbox

__all__ = ["CompositeSignals", "StoreSignals", "quantile"]

_COLUMNS = {"request_duration": "duration_s", "ttft": "ttft_s", "tpot": "tpot_s", "queue_time": "queue_s"}


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class StoreSignals:
    KINDS = ("dead_letters", "latency_quantile", "error_rate", "request_rate", "relevance")

    def __init__(
        self, engine: Engine, *, clock: Callable[[], float] = time.time, relevance_window_s: float = 900.0
    ):
        self.engine = engine
        self.clock = clock
        self.relevance_window_s = relevance_window_s

    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        if signal.kind == "dead_letters":
            with self.engine.connect() as conn:
                n = conn.execute(
                    select(func.count()).select_from(outbox).where(outbox.c.state == "dead")
                ).scalar()
            return [Sample((), float(n or 0))]
        if signal.kind not in self.KINDS:
            raise UnknownSignal(
                f"StoreSignals does not serve {signal.kind!r}; it serves {', '.join(self.KINDS)}"
            )
        window = signal.window_s or self.relevance_window_s
        since = dt.datetime.fromtimestamp(self.clock() - window, dt.UTC)
        if signal.kind == "relevance":
            return self._relevance(since, by)
        if signal.kind == "latency_quantile":
            assert signal.metric is not None
            value_col = requests.c[_COLUMNS[signal.metric]]
        else:
            value_col = requests.c.error_type
        q = select(requests.c.model, requests.c.model_version, value_col).where(
            requests.c.started_at >= since
        )
        groups: dict[tuple[tuple[str, str], ...], list[object]] = defaultdict(list)
        with self.engine.connect() as conn:
            for model, version, value in conn.execute(q):
                labels = {"model": model, "model_version": version}
                groups[tuple((k, v) for k, v in sorted(labels.items()) if k in by)].append(value)
        out = []
        for key, values in sorted(groups.items()):
            if signal.kind == "latency_quantile":
                xs = [float(v) for v in values if v is not None]  # type: ignore[arg-type]
                if xs:
                    out.append(Sample(key, quantile(xs, signal.quantile or 0.5)))
            elif signal.kind == "request_rate":
                out.append(Sample(key, len(values) / window))
            elif len(values) >= (signal.min_requests or 1):
                errors = sum(is_server_error(v) for v in values)  # type: ignore[arg-type]
                out.append(Sample(key, errors / len(values)))  # the client's outcomes are no errors
        return out

    def _relevance(self, since: dt.datetime, by: Sequence[str]) -> list[Sample]:
        """Mean relevance of the scored requests since `since`, per `by` group: summed in SQL
        per (model, version) over the partial index `ix_requests_relevance_time` (only the
        scored rows, index-only), then merged per group here."""
        r = requests.c
        q = (
            select(r.model, r.model_version, func.sum(r.relevance), func.count(r.relevance))
            .where(r.started_at >= since, r.relevance.is_not(None))
            .group_by(r.model, r.model_version)
        )
        sums: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
        with self.engine.connect() as conn:
            for model, version, total, n in conn.execute(q):
                labels = {"model": model, "model_version": version}
                acc = sums[tuple((k, v) for k, v in sorted(labels.items()) if k in by)]
                acc[0] += float(total or 0.0)
                acc[1] += int(n or 0)
        return [Sample(key, total / n) for key, (total, n) in sorted(sums.items()) if n]


class CompositeSignals:
    """Serves each signal kind from the source named for it, others from `default`."""

    def __init__(self, default: SignalSource, **by_kind: SignalSource) -> None:
        self.default = default
        self.by_kind = by_kind

    def read(self, signal: Signal, by: Sequence[str]) -> Sequence[Sample]:
        source = self.by_kind.get(signal.kind, self.default)
        return source.read(signal, by)
