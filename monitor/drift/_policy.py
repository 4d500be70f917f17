"""Drift policy: which stored reference each model version is tested against
(`ReferencePolicy`: the configured file, or the version's own first requests), and which
versions the batch drift test runs on, and when (`VersionPolicy`). `evaluate_window`
(_detector.py) runs the test the two policies call for.

- A version is tested once it has `min_window` sampled texts, and again each time half a
  `window` of new ones (at least `min_window`) arrived since its last verdict.
- A version whose traffic paused (no new text since the previous tick) with at least half
  of `min_window` unseen texts is tested at once rather than waiting for more.
- A version with no request at all for `stale_after_s` (rolled back, retired) is stale:
  its drift state should be dropped, so that its drift alerts resolve.

The texts per version are counted incrementally from the `requests` table: the first call
counts the lookback window, each later call only the rows added since (a primary-key
range), so a tick costs the same at a million rows as at a thousand
(docs/benchmarks/ingest.md). The counts are a trigger, not a statistic: a row committed out of id
order on PostgreSQL may be missed, which only delays an evaluation.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from infersight.monitor.store.tables import by_start, requests, started_in
from sqlalchemy import Engine, func, select

from ._detector import DriftDetector
from ._lengths import read_lengths
from ._references import (
    StoredReference,
    first_requests_after,
    load_reference,
    save_reference,
    traffic_lengths,
)
from ._windows import read_window
from .errors import ReferenceNotFound

__all__ = ["CONFIGURED_REFERENCE", "ReferencePolicy", "VersionPolicy"]


CONFIGURED_REFERENCE = "configured"  # the name the configured reference file is stored under


class ReferencePolicy:
    """Which stored reference each model version is tested against (drift policy).

    With a configured file (the service's `drift.reference`), every version is tested
    against it: stored at start as reference "configured", as a new version of it only when
    its texts changed. Without one, each model version gets its own reference from its
    first `window` sampled requests (source "deploy", name "<version>-baseline"), stored
    once that many exist, with every request's token lengths over the same span."""

    def __init__(
        self,
        engine: Engine,
        detector: DriftDetector,
        *,
        window: int,
        configured_path: str | Path | None = None,
    ) -> None:
        self.engine = engine
        self.detector = detector
        self.window = window
        self.configured_path = configured_path
        self.configured: str | None = None  # the name of the configured reference, once stored

    def store_configured(self) -> None:
        """Store the configured file as reference "configured" (unchanged texts: kept as is)."""
        if self.configured_path is None:
            return
        path = self.configured_path
        window = read_window(path, "reference")
        try:
            current = load_reference(self.engine, CONFIGURED_REFERENCE)
            if current.window.prompts == window.prompts and current.window.responses == window.responses:
                self.configured = CONFIGURED_REFERENCE
                return
        except ReferenceNotFound:
            pass
        (embedded,) = self.detector.embed(window)
        lengths = read_lengths(path, window.prompts, window.responses)
        save_reference(self.engine, CONFIGURED_REFERENCE, window, model_version="*", source="file",
                       source_detail=str(path), embedded=embedded, embedder=self.detector.embedder_name,
                       lengths=lengths)  # fmt: skip
        self.configured = CONFIGURED_REFERENCE

    def stored_for(self, model_version: str) -> StoredReference | None:
        """The reference `model_version` is tested against, if it is stored yet."""
        try:
            if self.configured is not None:
                return load_reference(self.engine, self.configured, embedder=self.detector.embedder_name)
            return load_reference(
                self.engine, model_version=model_version, embedder=self.detector.embedder_name
            )
        except ReferenceNotFound:
            return None

    def reference_for(self, model_version: str) -> StoredReference | None:
        """`stored_for`, storing the version's deploy baseline first when its first `window`
        requests are in; None while they are still being collected."""
        if self.configured is not None:
            return load_reference(self.engine, self.configured, embedder=self.detector.embedder_name)
        try:
            return load_reference(
                self.engine, model_version=model_version, embedder=self.detector.embedder_name
            )
        except ReferenceNotFound:
            pass
        first = self._first_seen(model_version)
        if first is None:
            return None
        window = first_requests_after(self.engine, model_version=model_version, after=first, n=self.window)
        if len(window.prompts) < self.window:
            return None  # still collecting the reference
        (embedded,) = self.detector.embed(window)
        # every request's lengths (sampled text or not) over the same span
        lengths = traffic_lengths(
            self.engine, model_version=model_version, since=first, until=dt.datetime.now(dt.UTC)
        )
        save_reference(self.engine, f"{model_version}-baseline", window, model_version=model_version,
                       source="deploy", source_detail=f"first {len(window.prompts)} requests after {first.isoformat()}",
                       embedded=embedded, embedder=self.detector.embedder_name, lengths=lengths)  # fmt: skip
        return load_reference(self.engine, model_version=model_version, embedder=self.detector.embedder_name)

    def _first_seen(self, model_version: str) -> dt.datetime | None:
        with self.engine.connect() as conn:
            value = conn.execute(
                select(requests.c.started_at)  # the first in the time index's order, not min(): no scan
                .where(requests.c.model_version == model_version, requests.c.prompt.is_not(None))
                .order_by(*by_start())
                .limit(1)
            ).scalar()
        return value if isinstance(value, dt.datetime) else None


class VersionPolicy:
    """Not thread-safe: one scheduler job (the batch test) asks it."""

    def __init__(self, engine: Engine, *, window: int, min_window: int, stale_after_s: float | None) -> None:
        self.engine = engine
        self.window = window
        self.min_window = min_window
        self.stale_after_s = stale_after_s
        self._last_count: dict[str, int] = {}  # texts counted at the version's last verdict
        self._tick_count: dict[str, int] = {}  # texts counted at the previous tick
        # the newest request (any, sampled or not) per (model, version), for staleness
        self._last_request: dict[tuple[str, str], dt.datetime] = {}
        # texts recorded per (model, version): rows with id <= _counted_to are counted
        self._text_counts: dict[tuple[str, str], int] = {}
        self._counted_to = 0

    def due(self, since: dt.datetime, *, force: bool = False) -> list[tuple[str, str, int]]:
        """(model, version, texts recorded) of the versions to test now; `force`: every
        version with `min_window` texts."""
        out = []
        for model, version, count in self.active(since):
            new = count - self._last_count.get(version, 0)
            # traffic paused (nothing new since the last tick) with some unseen texts: judge them now
            paused = new >= max(1, self.min_window // 2) and self._tick_count.get(version) == count
            self._tick_count[version] = count
            if not force and not paused and new < max(self.min_window, self.window // 2):
                continue
            if count < self.min_window:
                continue
            out.append((model, version, count))
        return out

    def tested(self, version: str, count: int) -> None:
        """The version got a verdict on its first `count` texts."""
        self._last_count[version] = count

    def stale(self, now: dt.datetime) -> list[tuple[str, str]]:
        """(model, version) of the versions with no request for `stale_after_s`."""
        if self.stale_after_s is None:
            return []
        cutoff = now - dt.timedelta(seconds=self.stale_after_s)
        return [key for key, last in self._last_request.items() if last < cutoff]

    def last_request(self, model: str, version: str) -> dt.datetime | None:
        return self._last_request.get((model, version))

    def active(self, since: dt.datetime) -> list[tuple[str, str, int]]:
        """(model, version, texts recorded) for versions with sampled text, counted
        incrementally (see the module's docstring)."""
        r = requests.c
        with self.engine.connect() as conn:
            top = conn.execute(select(func.max(r.id))).scalar() or 0
            if top <= self._counted_to:
                rows: list[Any] = []
            else:
                where = [r.id > self._counted_to, r.id <= top]
                if self._counted_to == 0:
                    where += started_in(since)
                rows = list(
                    conn.execute(
                        select(r.model, r.model_version, func.count(r.prompt), func.max(r.started_at))
                        .where(*where)
                        .group_by(r.model, r.model_version)
                    ).all()
                )
        for model, version, n, newest in rows:
            key = (model, version)
            if isinstance(newest, dt.datetime):
                previous = self._last_request.get(key)
                self._last_request[key] = newest if previous is None else max(previous, newest)
            if not n:
                continue
            self._text_counts[key] = self._text_counts.get(key, 0) + int(n)
        self._counted_to = max(self._counted_to, top)
        return [(m, v, n) for (m, v), n in sorted(self._text_counts.items())]
