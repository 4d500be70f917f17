"""Wiring drift scoring (infersight.monitor.drift) into a started service.

- Reference (the policy is the drift package's `ReferencePolicy`): `drift.reference` (a
  .jsonl/.csv/.txt file) is stored at start as reference "configured" (a new version only
  when its texts changed). Without one, each model version gets a reference from its first
  `drift.window` sampled requests ("deploy").
- Batch test (leader-only job `drift`, every `schedule.drift_s`; which versions and when
  is the drift package's `VersionPolicy`): for each model version
  with enough new sampled texts (half a window), or with half of `drift.min_window` new
  texts once its traffic paused for a tick, the newest `drift.window` of them against the
  reference (`evaluate_window`: report stored with its request-length section, relevance
  of those requests written back, gauges set). This is the path that runs; `POST
  /api/v1/drift/evaluate` only runs it now.
- A version with no request for `drift.stale_after_s` (rolled back, retired) has its drift
  state dropped (p-values, gauges, streaming chart), so its drift alerts resolve.
- Embeddings come from `default_embedder()` (`drift.embedder`, `drift.embed_threads`); its
  backend and precision are `infersight_embedder_info{backend, precision}`.
- Streaming (job `embed`): texts offered to the reservoir (a bounded, uniform sample:
  what does not fit is counted in `infersight_drift_texts_skipped_total`) are embedded in
  one batch per tick, their relevance stored and observed, and fed to a CUSUM chart per
  version; an alarm runs the batch test at once rather than at its next interval.
- The streaming job's CPU budget (`EmbedBudget`): `drift.embed_cpu` of one CPU on average.
  Each tick's CPU is measured (the job's own thread when the embedder computes on it, as
  with one runtime thread; else the whole process's during the tick, which can only
  overcount), and the next tick takes as many texts as the budget buys at the measured CPU
  per text, at most `drift.reservoir`. A faster embedder, or a warmer embedding cache,
  embeds more texts for the same CPU; a slower one fewer, never more CPU. Exposed as
  `infersight_drift_embed_capacity` and `infersight_drift_embed_cpu_seconds_total`.
- Quality signals for the alert rules (`drift_p_values`, `length_p_values`,
  `relevance_means`) and the post-deploy analysis's output-drift check come from here.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from infersight.monitor.store.tables import requests
from infersight.monitor.store.writer import RequestWriter
from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from sqlalchemy import Engine, bindparam, update

from .jobs import trim_heap
from .pipeline import SampledText, TextReservoir

if TYPE_CHECKING:
    from .config import DriftConfig

__all__ = ["DriftWiring", "EmbedBudget", "FirstUseEmbedder"]

log = logging.getLogger(__name__)
_LOOKBACK = dt.timedelta(hours=24)


class FirstUseEmbedder:
    """The embedder `make()` returns, made when it is first used (an encode, or any attribute
    such as its `name`), once, under a lock; `on_made(embedder)` is then called (the service
    updates `infersight_embedder_info`)."""

    def __init__(self, make: Callable[[], Any], on_made: Callable[[Any], None] = lambda e: None) -> None:
        self._make = make
        self._on_made = on_made
        self._inner: Any = None
        self._lock = threading.Lock()

    @property
    def made(self) -> bool:
        return self._inner is not None

    def _get(self) -> Any:
        inner = self._inner
        if inner is None:
            with self._lock:
                if self._inner is None:
                    made = self._make()
                    self._inner = made
                    self._on_made(made)
                inner = self._inner
        return inner

    def encode(self, texts: Any) -> Any:
        return self._get().encode(texts)

    def make(self) -> Any:
        """The embedder, made now if it was not yet (the embed job does this before it starts
        counting the tick's CPU: a first export is not what a text costs)."""
        return self._get()

    def __getattr__(self, name: str) -> Any:  # name, backend, precision, dimension, inner ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get(), name)


class EmbedBudget:
    """How many texts the next `embed` tick may take so that the job averages `cpu_share` of
    one CPU over ticks `interval_s` apart: the budget of a tick (`cpu_share * interval_s` CPU
    seconds) over the CPU a text has cost, measured on the ticks before (sums decayed by
    `decay` a tick, so a change of embedder, cache hit rate or text length shows within a few
    ticks), between `floor` and `ceiling`. Before any measurement: `start` (or `ceiling`,
    whichever is less). `cpu_share=None`: no budget, always `ceiling`.

    Measuring a tick of few texts counts the tick's fixed cost against each of them, so the
    estimate errs towards fewer texts, never towards more CPU; it is measured again at the
    next, larger tick."""

    def __init__(
        self,
        cpu_share: float | None,
        interval_s: float,
        *,
        ceiling: int,
        floor: int = 16,
        start: int = 64,
        decay: float = 0.7,
    ) -> None:
        if cpu_share is not None and not cpu_share > 0:
            raise ValueError("cpu_share must be positive or None")
        if not (interval_s > 0 and 1 <= floor <= ceiling and 0 <= decay < 1):
            raise ValueError("need interval_s > 0, 1 <= floor <= ceiling and 0 <= decay < 1")
        self.cpu_share = cpu_share
        self.interval_s = interval_s
        self.ceiling = ceiling
        self.floor = floor
        self.decay = decay
        self._cpu_s = 0.0
        self._texts = 0.0
        self.capacity = ceiling if cpu_share is None else max(floor, min(ceiling, start))

    @property
    def cpu_per_text(self) -> float | None:
        """CPU seconds a text has cost (decayed mean), None before the first measured tick."""
        return self._cpu_s / self._texts if self._texts > 0 else None

    def spent(self, cpu_s: float, texts: int) -> int:
        """A tick took `cpu_s` CPU seconds for `texts` texts -> the next tick's capacity."""
        if self.cpu_share is None or texts <= 0 or not cpu_s >= 0:
            return self.capacity
        self._cpu_s = self._cpu_s * self.decay + cpu_s
        self._texts = self._texts * self.decay + texts
        per_text = self._cpu_s / self._texts
        allowed = self.cpu_share * self.interval_s / per_text if per_text > 0 else float(self.ceiling)
        self.capacity = int(max(self.floor, min(self.ceiling, allowed)))
        return self.capacity


def runtime_threads(embedder: Any) -> int | None:
    """The threads of the runtime under `embedder`'s wrappers (`threads` of the first object
    down the `.inner` chain that has one), None where none says."""
    for _ in range(4):
        threads = getattr(embedder, "threads", None)
        if isinstance(threads, int):
            return threads
        embedder = getattr(embedder, "inner", None)
        if embedder is None:
            return None
    return None


class DriftWiring:
    """Drift scoring over `db`'s requests: texts drained from `reservoir` (their rows
    flushed by `writer` before their relevance is written), gauges in `registry`, each
    relevance and answer also shown to the running canary (`canary`, if any);
    `on_alarm` runs when a streaming chart alarms (the service: the batch test now)."""

    def __init__(
        self,
        config: DriftConfig,
        db: Engine,
        registry: CollectorRegistry,
        reservoir: TextReservoir,
        *,
        writer: RequestWriter | None = None,
        canary: Any = None,
        on_alarm: Callable[[], None] = lambda: None,
        detector: Any = None,
        interval_s: float = 2.0,
        cpu_clock: Callable[[], float] | None = None,
    ) -> None:
        """`interval_s`: the `embed` job's interval (the budget's tick); `cpu_clock`: what a
        tick's CPU is read from (default: chosen by where the embedder computes, above)."""
        from infersight.monitor import drift as d

        self.d = d
        self.config = config
        self.db = db
        self.reservoir = reservoir
        self.writer = writer
        self.canary = canary
        self.on_alarm = on_alarm
        embedder_info = Info("infersight_embedder", "What embeds texts for drift", registry=registry)

        def show(embedder: Any) -> None:
            embedder_info.info({"backend": str(getattr(embedder, "backend", "custom")),
                                "precision": str(getattr(embedder, "precision", "unknown"))})  # fmt: skip

        if detector is None:

            def make() -> Any:
                return d.default_embedder(
                    backend=config.embedder,
                    threads=config.embed_threads,
                    cache_entries=config.embedding_cache,
                )

            # "auto" exports and times both int8 runtimes the first time on a machine (40-80 s):
            # that belongs in the first drift tick, a background job, not in the service's start
            embedder = FirstUseEmbedder(make, show) if config.embedder == "auto" else make()
            detector = d.DriftDetector(embedder, config=d.DetectorConfig(alpha=self.config.alpha))
        self.detector = detector
        self.metrics = d.DriftMetrics(registry)
        if isinstance(detector.embedder, FirstUseEmbedder):
            embedder_info.info({"backend": "auto (chosen at first use)", "precision": "int8"})
        else:
            show(detector.embedder)
        self.alarms = Counter(
            "infersight_drift_stream_alarms", "Streaming (CUSUM) drift alarms", ["model_version", "signal"],
            registry=registry,
        )  # fmt: skip
        self.budget = EmbedBudget(config.embed_cpu, interval_s, ceiling=config.reservoir)
        reservoir.resize(self.budget.capacity)
        self._cpu_clock = cpu_clock
        self.capacity_gauge = Gauge(
            "infersight_drift_embed_capacity",
            "Texts the next embed tick may take (drift.embed_cpu over the measured CPU per text, "
            "at most drift.reservoir)",
            registry=registry,
        )
        self.capacity_gauge.set(self.budget.capacity)
        self.embed_cpu = Counter(
            "infersight_drift_embed_cpu_seconds",
            "CPU seconds the streaming embed job took (its thread, or the process's during a tick "
            "when the embedder runs on several threads)",
            registry=registry,
        )
        self._lock = threading.Lock()
        self._p_values: dict[str, dict[tuple[str, str], float]] = {"prompt": {}, "response": {}}
        self._relevance: dict[tuple[str, str], float] = {}
        self._lengths: dict[str, dict[tuple[str, str], float]] = {"prompt": {}, "output": {}}
        self._streams: dict[str, Any] = {}
        # the policy (which reference, which versions, when) is the drift package's
        self.references = d.ReferencePolicy(db, detector, window=self.config.window,
                                            configured_path=self.config.reference)  # fmt: skip
        self.versions = d.VersionPolicy(db, window=config.window, min_window=config.min_window,
                                        stale_after_s=config.stale_after_s)  # fmt: skip

    # -- references ------------------------------------------------------------------------
    def store_configured_reference(self) -> None:
        self.references.store_configured()

    def _reference_for(self, model_version: str) -> Any:
        return self.references.reference_for(model_version)

    # -- the batch test -----------------------------------------------------------------
    def evaluate(self, *, force: bool = False) -> list[Any]:
        now = dt.datetime.now(dt.UTC)
        since = now - _LOOKBACK
        reports = []
        for model, version, count in self.versions.due(since, force=force):
            stored = self._reference_for(version)
            if stored is None:
                continue
            # a reference built from a version's first requests is compared with what came after
            since_v = max(since, stored.info.created_at) if stored.info.source == "deploy" else since
            try:
                report = self.d.evaluate_window(
                    self.db, detector=self.detector, model_version=version, reference=stored,
                    since=since_v, until=now + dt.timedelta(seconds=1), model=model, metrics=self.metrics,
                    max_current=self.config.window,
                )  # fmt: skip
            except self.d.WindowError as exc:
                log.info("no drift verdict for %s yet: %s", version, exc)
                continue
            self.versions.tested(version, count)
            self._remember(model, version, report)
            reports.append(report)
        self.expire(now)
        return reports

    def expire(self, now: dt.datetime) -> list[tuple[str, str]]:
        """Drop the drift state of versions with no request for `drift.stale_after_s`;
        returns the (model, version) pairs dropped."""
        with self._lock:
            stale = [key for key in self.versions.stale(now) if self._has_state(key)]
            for key in stale:
                for values in (*self._p_values.values(), *self._lengths.values(), self._relevance):
                    values.pop(key, None)
        for model, version in stale:
            self.metrics.forget(model=model, model_version=version)
            self._streams.pop(version, None)
            last = self.versions.last_request(model, version)
            log.info("drift state of %s %s dropped: no request since %s", model, version,
                     last.isoformat() if last is not None else "?")  # fmt: skip
        return stale

    def _has_state(self, key: tuple[str, str]) -> bool:
        return any(
            key in values for values in (*self._p_values.values(), *self._lengths.values(), self._relevance)
        )

    def _remember(self, model: str, version: str, report: Any) -> None:
        with self._lock:
            for f in report.fields:
                if f.field in self._p_values:
                    self._p_values[f.field][(model, version)] = float(f.p_value)
            if report.relevance is not None and report.relevance.current.mean is not None:
                self._relevance[(model, version)] = float(report.relevance.current.mean)
            if report.lengths is not None:
                for name, values in self._lengths.items():
                    p = report.lengths.field_p_value(name)
                    if p is not None:
                        values[(model, version)] = float(p)

    # -- streaming ----------------------------------------------------------------------
    def _clock(self) -> Callable[[], float]:
        embedder = self.detector.embedder
        if isinstance(embedder, FirstUseEmbedder):
            embedder.make()  # before the tick's clock starts: the first export is not a text's cost
        if self._cpu_clock is not None:
            return self._cpu_clock
        # one runtime thread computes on the caller's: this thread's clock is the job's CPU; on
        # several (or a runtime that does not say), the process's, which can only overcount
        return time.thread_time if runtime_threads(embedder) == 1 else time.process_time

    def embed(self) -> int:
        """The job: embed what the reservoir holds, then size it for the next tick."""
        items = self.reservoir.drain()
        items = [i for i in items if i.prompt]
        if not items:
            return 0
        clock = self._clock()
        started = clock()
        try:
            return self._embed(items)
        finally:
            spent = max(0.0, clock() - started)
            self.embed_cpu.inc(spent)
            self.reservoir.resize(self.budget.spent(spent, len(items)))
            self.capacity_gauge.set(self.budget.capacity)

    def _embed(self, items: list[SampledText]) -> int:
        window = self.d.TextWindow.of([i.prompt or "" for i in items], [i.response for i in items])
        (embedded,) = self.detector.embed(window)
        with_response = [i for i in items if i.response is not None]
        self._store_relevance(with_response, embedded.relevance)
        by_version: dict[tuple[str, str], list[float]] = {}
        for item, value in zip(with_response, embedded.relevance, strict=True):
            by_version.setdefault((item.model, item.model_version), []).append(float(value))
        canary = self.canary
        for (model, version), values in by_version.items():
            self.metrics.observe_relevance(values, model=model, model_version=version)
            if canary is not None:
                for value in values:
                    canary.on_relevance(version, value)
        if canary is not None:  # the answers themselves: the canary's output-drift check
            for item, vector in zip(with_response, embedded.response_embeddings, strict=True):
                canary.on_output(item.model_version, vector.tolist())
        self._stream(items, embedded)
        trim_heap()  # the model's buffers of this batch go back to the OS (jobs.py)
        return len(items)

    def _store_relevance(self, items: list[SampledText], values: Any) -> None:
        if not items:
            return
        if self.writer is not None:
            self.writer.flush(10.0)  # the rows must exist before their relevance is set
        with self.db.begin() as conn:
            conn.execute(
                update(requests)
                .where(requests.c.request_id == bindparam("rid"))
                .values(relevance=bindparam("rel")),
                [{"rid": i.request_id, "rel": float(v)} for i, v in zip(items, values, strict=True)],
            )

    def _stream(self, items: list[SampledText], embedded: Any) -> None:
        response_rows = {id(i): k for k, i in enumerate(i for i in items if i.response is not None)}
        alarmed: set[str] = set()
        charts: dict[str, Any] = {}  # each version's chart looked up once a tick, not once a text
        for k, item in enumerate(items):
            version = item.model_version
            if version not in charts:
                charts[version] = self._stream_for(version)
            detector = charts[version]
            if detector is None:
                continue
            r = response_rows.get(id(item))
            update_ = detector.observe(
                embedded.prompt_embeddings[k], embedded.response_embeddings[r] if r is not None else None
            )
            for signal in update_.signals:
                self.alarms.labels(item.model_version, signal).inc()
                alarmed.add(item.model_version)
        if alarmed:
            self.on_alarm()

    def _stream_for(self, version: str) -> Any:
        if version in self._streams:
            return self._streams[version]
        stored = self.references.stored_for(version)
        if stored is None:
            return None  # no chart until the version has a reference
        fitted = stored.embedded if stored.embedded is not None else self.detector.embed(stored.window)[0]
        try:
            self._streams[version] = self.d.StreamingDetector(fitted)
        except (ValueError, self.d.DriftError) as exc:
            log.info("no streaming chart for %s: %s", version, exc)
            self._streams[version] = None
        return self._streams[version]

    # -- what the alert rules, the analysis and the page read -----------------------------
    def drift_p_values(self, field: str) -> Mapping[tuple[str, str], float]:
        with self._lock:
            return dict(self._p_values.get(field, {}))

    def length_p_values(self, field: str) -> Mapping[tuple[str, str], float]:
        with self._lock:
            return dict(self._lengths.get(field, {}))

    def relevance_means(self) -> Mapping[tuple[str, str], float]:
        with self._lock:
            return dict(self._relevance)

    def output_drift_p_value(self, new: str, old: str, since: dt.datetime) -> float | None:
        """Responses of `new` since the deploy against `old`'s before it (post-deploy check)."""
        db, n = self.db, self.config.window
        before = self.d.traffic_window(db, model_version=old, since=since - _LOOKBACK, until=since, limit=n)
        after = self.d.traffic_window(
            db, model_version=new, since=since, until=dt.datetime.now(dt.UTC), limit=n
        )
        if min(len(before.prompts), len(after.prompts)) < self.config.min_window:
            return None
        if not before.responses or not after.responses:
            return None
        report = self.detector.score(before, after)
        fields = [f for f in report.fields if f.field == "response"]
        return float(fields[0].p_value) if fields else None

    def latest_summary(self) -> dict[str, Any] | None:
        found = self.d.list_reports(self.db, limit=1)
        return found[0] if found else None

    def latest_report_json(self) -> dict[str, Any] | None:
        summary = self.latest_summary()
        return None if summary is None else self.d.load_report(self.db, int(summary["id"]))
