"""The slowdown checklist, run by itself: why did throughput fall or the p99 rise?

`diagnose(engine, ...)` compares the alert's window (the last `window_s`) with a baseline
window: the same hours one `baseline_offset_s` earlier (a day: the same hour's traffic),
or, where that window holds too few requests, the window just before the current one.
Each check gives a verdict ("suspect", "clear" or "unknown": no data), a figure a person
reads, and a score in [0, 1] (how strongly it points at the cause); the checks are ranked
by score, suspects first.

- memory: least-squares slope of GPU memory used and process RSS over the window's
  samples (bytes per minute); a slope over `leak_bytes_per_min` is a suspected leak.
- kernel/step time: with the embedded engine, its own decode step time at like batch sizes
  (`StepSample`s the service samples from the engine's measured steps: a batch size run in
  both windows compares its median step now with before; the ratio is the geometric mean
  over those sizes, weighted by the fewer samples), so a shift to larger batches does not
  read as slower kernels. For a proxy or OTLP source (no step samples), or where no batch
  size ran in both windows, the median time per output token (TPOT) on requests of like
  prompt length (under the long-prompt threshold) instead.
- request distribution: the length drift test of monitor/drift (prompt and output token
  lengths, the current window against the baseline) and the share of requests whose prompt
  is over `long_prompt_tokens`, now and before.
- dependency versions: the environment record in force now against the one of the
  baseline window (monitor/business/_environment.py): any component that changed.
- load: the correlation over the window's minutes of the p99 with the request rate and
  the mean queue time, and over the service's samples with GPU busy (SM activity) and the
  process's CPU busy; and the p99 at like load before and now: minutes whose rate is within
  a fifth of the current median rate, and samples whose CPU busy is within a fifth of the
  current median. It is not load when the p99 is higher at every like load measured.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from infersight.monitor.drift import RequestLengths, length_drift
from infersight.monitor.store.tables import requests, started_in
from sqlalchemy import Engine, select

from ._environment import changed_components, environment_at

__all__ = ["CHECKS", "Check", "Diagnosis", "StepSample", "diagnose"]

CHECKS = ("memory", "kernel/step time", "request distribution", "dependency versions", "load")
_MIN_REQUESTS = 20


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # suspect, clear, unknown
    score: float  # 0..1
    figure: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict, "score": round(self.score, 4),
                "figure": self.figure, "detail": dict(self.detail)}  # fmt: skip


@dataclass(frozen=True)
class StepSample:
    """The embedded engine's decode step seconds by batch size, of the steps one version ran
    during one sampling tick of the service (`at`: epoch seconds)."""

    at: float
    version: str
    decode_s: Mapping[int, float]


@dataclass(frozen=True)
class Diagnosis:
    at: dt.datetime
    window: tuple[dt.datetime, dt.datetime]
    baseline: tuple[dt.datetime, dt.datetime]
    checks: tuple[Check, ...]  # ranked

    @property
    def summary(self) -> str:
        suspects = [c for c in self.checks if c.verdict == "suspect"]
        if not suspects:
            return "checklist: no check points at a cause (" + "; ".join(
                f"{c.name}: {c.figure}" for c in self.checks[:2]) + ")"  # fmt: skip
        return "checklist, most likely first: " + "; ".join(f"{c.name}: {c.figure}" for c in suspects[:3])

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "window": [t.isoformat() for t in self.window],
            "baseline": [t.isoformat() for t in self.baseline],
            "summary": self.summary,
            "checks": [c.to_json() for c in self.checks],
        }


@dataclass(frozen=True)
class _Row:
    started_at: float
    duration_s: float
    tpot_s: float | None
    queue_s: float | None
    prompt_tokens: int | None
    output_tokens: int | None


def _between(readings: Mapping[str, Any] | None, a: dt.datetime, b: dt.datetime) -> dict[str, Any] | None:
    """The service's samples taken from `a` to `b`."""
    if not readings or not readings.get("t"):
        return None
    lo, hi = a.timestamp(), b.timestamp()
    keep = [i for i, t in enumerate(readings["t"]) if lo <= t <= hi]
    series = {k: [v[i] for i in keep if i < len(v)] for k, v in readings.get("series", {}).items()}
    return {"t": [readings["t"][i] for i in keep], "series": series}


def _rows(engine: Engine, since: dt.datetime, until: dt.datetime, version: str | None) -> list[_Row]:
    r = requests.c
    q = select(r.started_at, r.duration_s, r.tpot_s, r.queue_s, r.prompt_tokens, r.output_tokens).where(
        *started_in(since, until)
    )
    if version is not None:
        q = q.where(r.model_version == version)
    with engine.connect() as conn:
        return [_Row(row[0].timestamp(), *row[1:]) for row in conn.execute(q)]


def _slope_per_min(t: Sequence[float], v: Sequence[float | None]) -> float | None:
    pts = [(a, b) for a, b in zip(t, v, strict=False) if b is not None]
    if len(pts) < 3:
        return None
    x = np.array([p[0] for p in pts]) / 60.0
    y = np.array([p[1] for p in pts], dtype=float)
    if float(np.ptp(x)) == 0:
        return None
    return float(np.polyfit(x, y, 1)[0])


def _memory(readings: Mapping[str, Any] | None, leak_bytes_per_min: float) -> Check:
    if not readings or not readings.get("t"):
        return Check("memory", "unknown", 0.0, "no memory samples in the window")
    series = readings.get("series", {})
    slopes = {name: _slope_per_min(readings["t"], series.get(key, []))
              for name, key in (("gpu", "gpu_memory_used_bytes"), ("process", "process_rss_bytes"))}  # fmt: skip
    known = {k: s for k, s in slopes.items() if s is not None}
    if not known:
        return Check("memory", "unknown", 0.0, "no memory samples in the window")
    worst = max(known, key=lambda k: known[k])
    slope = known[worst]
    figure = ", ".join(f"{k} {s / 2**20:+.1f} MiB/min" for k, s in known.items())
    leak = slope > leak_bytes_per_min
    return Check("memory", "suspect" if leak else "clear", min(1.0, max(0.0, slope / leak_bytes_per_min) / 2),
                 ("leak suspected: " if leak else "no leak: ") + figure, {"slopes_bytes_per_min": known})  # fmt: skip


def _median(xs: Sequence[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def _steps(now: Sequence[StepSample], base: Sequence[StepSample]) -> Check | None:
    """The decode step check at like batch sizes; None where no size ran in both windows."""

    def by_batch(samples: Sequence[StepSample]) -> dict[int, list[float]]:
        out: dict[int, list[float]] = defaultdict(list)
        for sample in samples:
            for batch, seconds in sample.decode_s.items():
                out[batch].append(seconds)
        return out

    a, b = by_batch(now), by_batch(base)
    like = sorted(set(a) & set(b))
    if not like:
        return None
    pairs = {k: (float(np.median(b[k])), float(np.median(a[k]))) for k in like}
    weights = np.array([min(len(a[k]), len(b[k])) for k in like], dtype=float)
    logs = np.array([math.log(max(pairs[k][1], 1e-12) / max(pairs[k][0], 1e-12)) for k in like])
    ratio = float(math.exp(float(np.average(logs, weights=weights))))
    slower = ratio > 1.2
    text = ", ".join(f"batch {k}: {pairs[k][0] * 1000:.1f} -> {pairs[k][1] * 1000:.1f} ms" for k in like[:4])
    return Check("kernel/step time", "suspect" if slower else "clear", min(1.0, max(0.0, ratio - 1.0)),
                 f"engine decode step {ratio:.2f}x at like batch sizes ({text})",
                 {"source": "engine", "ratio": ratio,
                  "decode_step_s": {str(k): {"baseline": v[0], "now": v[1]} for k, v in pairs.items()}})  # fmt: skip


def _kernel(now: list[_Row], base: list[_Row], long_prompt: int, note: str = "") -> Check:
    def tpots(rows: list[_Row]) -> list[float]:
        return [r.tpot_s for r in rows if r.tpot_s is not None and (r.prompt_tokens or 0) <= long_prompt]

    a, b = tpots(now), tpots(base)
    if len(a) < 5 or len(b) < 5:
        return Check(
            "kernel/step time", "unknown", 0.0, "too few requests of like prompt length with a TPOT" + note
        )
    ma, mb = _median(a), _median(b)
    assert ma is not None and mb is not None
    ratio = ma / mb if mb > 0 else math.inf
    slower = ratio > 1.2
    return Check("kernel/step time", "suspect" if slower else "clear", min(1.0, max(0.0, (ratio - 1.0) / 1.0)),
                 f"TPOT {mb * 1000:.1f} -> {ma * 1000:.1f} ms ({ratio:.2f}x) at like prompt length{note}",
                 {"source": "tpot", "tpot_now_s": ma, "tpot_baseline_s": mb, "ratio": ratio})  # fmt: skip


def _distribution(now: list[_Row], base: list[_Row], long_prompt: int) -> Check:
    def share(rows: list[_Row]) -> float:
        known = [r.prompt_tokens for r in rows if r.prompt_tokens is not None]
        return sum(p > long_prompt for p in known) / len(known) if known else 0.0

    if not any(r.prompt_tokens is not None for r in now):
        return Check("request distribution", "unknown", 0.0, "no prompt lengths recorded")
    s_now, s_base = share(now), share(base)
    drift = length_drift(
        RequestLengths.of([r.prompt_tokens for r in base], [r.output_tokens for r in base]),
        RequestLengths.of([r.prompt_tokens for r in now], [r.output_tokens for r in now]),
    )
    p_prompt, p_output = drift.field_p_value("prompt"), drift.field_p_value("output")
    drifted = any(p is not None and p < 0.05 for p in (p_prompt, p_output))
    rise = s_now - s_base
    suspect = drifted or rise > 0.05
    score = min(1.0, max(rise * 2.5, 0.0) + (0.3 if drifted else 0.0))
    p_text = " n/a" if p_prompt is None else "<0.001" if p_prompt < 0.001 else f"={p_prompt:.2g}"
    return Check(
        "request distribution", "suspect" if suspect else "clear", score,
        f"{s_now:.0%} of prompts over {long_prompt} tokens (before {s_base:.0%}); prompt length drift p{p_text}",
        {"long_prompt_share": s_now, "long_prompt_share_baseline": s_base,
         "prompt_p_value": p_prompt, "output_p_value": p_output},
    )  # fmt: skip


def _dependencies(engine: Engine, now: dt.datetime, base_end: dt.datetime) -> Check:
    current, before = environment_at(engine, now), environment_at(engine, base_end)
    if current is None or before is None:
        return Check("dependency versions", "unknown", 0.0, "no environment record for both windows")
    changed = changed_components(before.versions, current.versions)
    if not changed:
        return Check("dependency versions", "clear", 0.0, "no version changed since the baseline window")
    text = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items())
    return Check("dependency versions", "suspect", 0.9, f"changed since the baseline window: {text}",
                 {"changed": {k: list(v) for k, v in changed.items()}})  # fmt: skip


def _per_minute(rows: list[_Row]) -> list[tuple[int, float, float]]:
    """(requests, p99, mean queue s) per minute with requests."""
    by: dict[int, list[_Row]] = defaultdict(list)
    for r in rows:
        by[int(r.started_at // 60)].append(r)
    out = []
    for _, rs in sorted(by.items()):
        q = [r.queue_s for r in rs if r.queue_s is not None]
        out.append(
            (len(rs), float(np.quantile([r.duration_s for r in rs], 0.99)), float(np.mean(q)) if q else 0.0)
        )
    return out


def _corr(a: Sequence[float], b: Sequence[float]) -> float | None:
    if len(a) < 3 or float(np.std(a)) == 0 or float(np.std(b)) == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def _sampled(readings: Mapping[str, Any] | None, name: str) -> list[tuple[float, float]]:
    """(busy, p99) of the service's samples that have both."""
    if not readings:
        return []
    series = readings.get("series", {})
    return [(a, b) for a, b in zip(series.get(name, []), series.get("latency_p99_s", []), strict=False)
            if a is not None and b is not None]  # fmt: skip


def _busy_corr(pairs: list[tuple[float, float]]) -> float | None:
    return _corr([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) >= 3 else None


def _like(
    now: Sequence[tuple[float, float]], base: Sequence[tuple[float, float]]
) -> tuple[float | None, float | None]:
    """Median p99 of (load, p99) points whose load is within a fifth of the current median load."""
    if not now:
        return None, None
    typical = float(np.median([m[0] for m in now]))
    return (_median([m[1] for m in base if abs(m[0] - typical) <= typical / 5]),
            _median([m[1] for m in now if abs(m[0] - typical) <= typical / 5]))  # fmt: skip


def _load(
    now: list[_Row],
    base: list[_Row],
    readings: Mapping[str, Any] | None = None,
    base_readings: Mapping[str, Any] | None = None,
) -> Check:
    m_now, m_base = _per_minute(now), _per_minute(base)
    if len(m_now) < 3:
        return Check("load", "unknown", 0.0, "fewer than three minutes of requests in the window")
    rate_corr = _corr([m[0] for m in m_now], [m[1] for m in m_now])
    queue_corr = _corr([m[2] for m in m_now], [m[1] for m in m_now])
    busy_corr = _busy_corr(_sampled(readings, "gpu_sm_activity_ratio"))
    cpu_now = _sampled(readings, "process_cpu_seconds_per_s")
    cpu_corr = _busy_corr(cpu_now)
    before, after = _like([(m[0], m[1]) for m in m_now], [(m[0], m[1]) for m in m_base])
    cpu_before, cpu_after = _like(cpu_now, _sampled(base_readings, "process_cpu_seconds_per_s"))
    strongest = max(
        (abs(c) for c in (rate_corr, queue_corr, busy_corr, cpu_corr) if c is not None), default=0.0
    )
    likes = [(b, a) for b, a in ((before, after), (cpu_before, cpu_after)) if b is not None and a is not None]
    # higher at every like load measured: something other than load made it slower
    same_load_slower = bool(likes) and all(a > b * 1.2 for b, a in likes)
    suspect = strongest > 0.6 and not same_load_slower

    def ms(b: float | None, a: float | None) -> str:
        return "n/a" if b is None or a is None else f"{b * 1000:.0f} -> {a * 1000:.0f} ms"

    like = f"{ms(before, after)}, at like CPU busy {ms(cpu_before, cpu_after)}"
    if same_load_slower:
        like += " (slower at the same load: not load)"

    def fmt(c: float | None) -> str:
        return "n/a" if c is None else f"{c:+.2f}"

    return Check(
        "load", "suspect" if suspect else "clear", strongest * (0.3 if same_load_slower else 0.7),
        f"p99 vs request rate r={fmt(rate_corr)}, vs queue time r={fmt(queue_corr)}, vs GPU busy "
        f"r={fmt(busy_corr)}, vs CPU busy r={fmt(cpu_corr)}; p99 at like load {like}",
        {"rate_correlation": rate_corr, "queue_correlation": queue_corr, "gpu_busy_correlation": busy_corr,
         "cpu_busy_correlation": cpu_corr, "p99_like_load_baseline_s": before, "p99_like_load_now_s": after,
         "p99_like_cpu_baseline_s": cpu_before, "p99_like_cpu_now_s": cpu_after},
    )  # fmt: skip


def diagnose(
    engine: Engine,
    *,
    now: dt.datetime,
    model_version: str | None = None,
    window_s: float = 900.0,
    baseline_offset_s: float = 86_400.0,
    long_prompt_tokens: int = 2048,
    leak_bytes_per_min: float = 50 * 2**20,
    readings: Mapping[str, Any] | None = None,
    step_samples: Sequence[StepSample] | None = None,
) -> Diagnosis:
    """Runs every check of the module docstring and ranks them. `readings`: the service's
    time series (`Timeseries.window`) reaching back at least to the baseline window, for
    the memory and load checks; `step_samples`: the embedded engine's decode steps (None:
    no engine here, e.g. a proxy or OTLP source; the step check then reads TPOT)."""
    since = now - dt.timedelta(seconds=window_s)
    cur = _rows(engine, since, now, model_version)
    b_since, b_until = (
        since - dt.timedelta(seconds=baseline_offset_s),
        now - dt.timedelta(seconds=baseline_offset_s),
    )
    base = _rows(engine, b_since, b_until, model_version)
    if len(base) < _MIN_REQUESTS:  # no same-hour traffic: the window just before
        b_since, b_until = since - dt.timedelta(seconds=window_s), since
        base = _rows(engine, b_since, b_until, model_version)
    kernel = None
    if step_samples is not None:

        def steps_in(a: dt.datetime, b: dt.datetime) -> list[StepSample]:
            lo, hi = a.timestamp(), b.timestamp()
            return [s for s in step_samples if lo <= s.at <= hi and model_version in (None, s.version)]

        kernel = _steps(steps_in(since, now), steps_in(b_since, b_until))
    if kernel is None:
        note = "" if step_samples is None else " (no engine decode steps at like batch sizes in both windows)"
        kernel = _kernel(cur, base, long_prompt_tokens, note)
    current = _between(readings, since, now)
    checks = [
        _memory(current, leak_bytes_per_min),
        kernel,
        _distribution(cur, base, long_prompt_tokens),
        _dependencies(engine, now, b_until),
        _load(cur, base, current, _between(readings, b_since, b_until)),
    ]
    order = {"suspect": 0, "clear": 1, "unknown": 2}
    ranked = sorted(checks, key=lambda c: (order[c.verdict], -c.score, CHECKS.index(c.name)))
    return Diagnosis(now, (since, now), (b_since, b_until), tuple(ranked))
