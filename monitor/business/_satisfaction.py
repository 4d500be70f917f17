"""Satisfaction against latency: what a faster tail is worth to the people who use it.

Per model version and SLA path, from the requests that received feedback:

- the satisfaction rate (mean normalised score) per latency bucket, on the request's own
  latency (end-to-end or time to first token), as observed;
- a fitted curve: logistic regression of the score (a rate in [0, 1]; quasi-binomial, by
  iteratively reweighted least squares) on latency, with one intercept per prompt-length
  stratum and one latency slope. Long prompts are both slower and rated differently, so a
  curve on latency alone would blame latency for the prompts; with a stratum intercept,
  the slope compares requests of like prompt length (the strata are the population's
  prompt-length tertiles). The curve shown is standardised to the population's own mix of
  strata. Logistic rather than isotonic: an isotonic fit is monotone by construction, so
  its "worth" could never be negative and its interval would not cover zero when latency
  does not matter; the logistic slope can come out either way;
- a 95% band and interval from a bootstrap over requests (percentiles, seeded);
- `worth`: a p99 cut from X (the current p99) to Y, modelled as every request slower than
  Y answered in Y (the smallest change that makes the p99 Y), scored by the curve: the
  mean change in predicted satisfaction, in points (percent).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._feedback import JoinedFeedback

__all__ = [
    "LATENCY_BUCKETS_S",
    "METRICS",
    "CurvePoint",
    "LatencyBucket",
    "SatisfactionFit",
    "Worth",
    "fit_satisfaction",
    "satisfaction_by_group",
]

METRICS = ("e2e", "ttft")
LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
_MIN_FIT = 30  # fewer rated requests than this: buckets only, no curve
_STRATA = 5
_MAX_LATENCY_S = 86_400.0


@dataclass(frozen=True)
class LatencyBucket:
    le_s: float  # upper edge (inf: the rest)
    count: int
    satisfaction: float | None  # mean score of the bucket's requests


@dataclass(frozen=True)
class CurvePoint:
    latency_s: float
    satisfaction: float
    low: float
    high: float


@dataclass(frozen=True)
class Worth:
    p99_from_s: float
    p99_to_s: float
    points: float  # +Z points of satisfaction
    low: float
    high: float

    def sentence(self) -> str:
        return (
            f"a p99 cut from {self.p99_from_s * 1000:.0f} to {self.p99_to_s * 1000:.0f} ms is worth "
            f"{self.points:+.1f} points of satisfaction (95% CI {self.low:+.1f} to {self.high:+.1f})"
        )


@dataclass(frozen=True)
class SatisfactionFit:
    model_version: str
    path: str | None
    metric: str  # e2e or ttft
    n: int
    satisfaction: float  # mean score
    buckets: tuple[LatencyBucket, ...]
    method: str
    strata_edges: tuple[float, ...]  # prompt-token edges of the strata
    slope_per_s: float | None  # log-odds per second of latency, prompt length held fixed
    slope_low: float | None
    slope_high: float | None
    curve: tuple[CurvePoint, ...]
    worth: Worth | None


def _logistic_fit(
    X: np.ndarray, y: np.ndarray, iters: int = 25, start: np.ndarray | None = None
) -> np.ndarray | None:
    """Quasi-binomial logistic regression by IRLS -> coefficients, or None when it fails.
    `start`: where to begin (a bootstrap resample starts from the whole sample's fit)."""
    beta = np.zeros(X.shape[1]) if start is None else start.copy()
    for _ in range(iters):
        eta = np.clip(X @ beta, -30, 30)
        p = 1.0 / (1.0 + np.exp(-eta))
        w = np.maximum(p * (1 - p), 1e-9)
        z = eta + (y - p) / w
        XtW = X.T * w
        try:
            new = np.linalg.solve(XtW @ X + 1e-8 * np.eye(X.shape[1]), XtW @ z)
        except np.linalg.LinAlgError:
            return None
        if np.max(np.abs(new - beta)) < 1e-6:
            return new
        beta = new
    return beta


def _design(lat: np.ndarray, strata: np.ndarray, prompt: np.ndarray, k: int) -> np.ndarray:
    """[stratum intercepts (k), stratum x prompt length (k), latency]: within a stratum the
    score may still move with prompt length (a stratum of long prompts spans a wide range)."""
    rows = np.arange(len(lat))
    X = np.zeros((len(lat), 2 * k + 1))
    X[rows, strata] = 1.0
    X[rows, k + strata] = prompt
    X[:, 2 * k] = lat
    return X


def _predict(beta: np.ndarray, lat: np.ndarray, strata: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    k = (len(beta) - 1) // 2
    eta = beta[strata] + beta[k + strata] * prompt + beta[-1] * lat
    return 1.0 / (1.0 + np.exp(-np.clip(eta, -30, 30)))


def _strata(prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[float, ...], int]:
    """-> (stratum per request, prompt length scaled within its stratum to [0, 1], edges, k)."""
    known = prompt[~np.isnan(prompt)]
    if len(known) < _STRATA * 10:
        return np.zeros(len(prompt), dtype=int), np.zeros(len(prompt)), (), 1
    edges = tuple(float(e) for e in np.unique(np.quantile(known, [i / _STRATA for i in range(1, _STRATA)])))
    filled = np.where(np.isnan(prompt), np.median(known), prompt)
    strata = np.searchsorted(np.asarray(edges), filled, side="right")
    used = np.unique(strata)
    remap = {s: i for i, s in enumerate(used)}  # empty strata would make the design singular
    strata = np.array([remap[s] for s in strata], dtype=int)
    scaled = np.zeros(len(prompt))
    for s in range(len(used)):
        mask = strata == s
        lo, hi = float(filled[mask].min()), float(filled[mask].max())
        scaled[mask] = (filled[mask] - lo) / (hi - lo) if hi > lo else 0.0
    return strata, scaled, edges, len(used)


def _worth_of(beta: np.ndarray, lat: np.ndarray, strata: np.ndarray, prompt: np.ndarray, to_s: float) -> float:
    capped = np.minimum(lat, to_s)
    return float(np.mean(_predict(beta, capped, strata, prompt) - _predict(beta, lat, strata, prompt)) * 100.0)


def _curve_of(beta: np.ndarray, grid: np.ndarray, strata: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """The satisfaction predicted at each latency for the population's own prompts."""
    k = (len(beta) - 1) // 2
    base = beta[strata] + beta[k + strata] * prompt  # [N]
    eta = np.clip(base[None, :] + beta[-1] * grid[:, None], -30, 30)  # [G, N]
    return np.asarray((1.0 / (1.0 + np.exp(-eta))).mean(axis=1))


def fit_satisfaction(
    latency_s: Sequence[float],
    scores: Sequence[float],
    prompt_tokens: Sequence[int | None],
    *,
    model_version: str = "",
    path: str | None = None,
    metric: str = "e2e",
    target_s: float | None = None,
    bootstrap: int = 200,
    seed: int = 0,
) -> SatisfactionFit:
    """Buckets, curve, band and worth of one population (see the module docstring).
    `target_s`: the p99 after the cut (default: half the current p99)."""
    # a latency past a day is a clock's fault, not a wait: clipped, so no sum overflows
    lat = np.clip(np.asarray(latency_s, dtype=float), 0.0, _MAX_LATENCY_S)
    y = np.asarray(scores, dtype=float)
    prompt = np.array([np.nan if p is None else float(p) for p in prompt_tokens])
    n = len(lat)
    buckets, lo_edge = [], -math.inf
    for le in LATENCY_BUCKETS_S:
        mask = (lat > lo_edge) & (lat <= le)
        c = int(mask.sum())
        buckets.append(LatencyBucket(le, c, float(y[mask].mean()) if c else None))
        lo_edge = le
    mean = float(y.mean()) if n else math.nan
    strata, scaled, edges, k = _strata(prompt)
    empty = SatisfactionFit(model_version, path, metric, n, mean, tuple(buckets), "logistic", edges,
                            None, None, None, (), None)  # fmt: skip
    if n < _MIN_FIT or float(np.ptp(lat)) <= 0:
        return empty
    beta = _logistic_fit(_design(lat, strata, scaled, k), y)
    if beta is None:
        return empty
    p99 = float(np.quantile(lat, 0.99))
    to_s = target_s if target_s is not None else p99 / 2
    grid = np.quantile(lat, np.linspace(0.01, 0.99, 25))
    rng = np.random.default_rng(seed)
    boot_slopes, boot_worth, boot_curves = [], [], []
    for _ in range(bootstrap):
        idx = rng.integers(0, n, n)
        b = _logistic_fit(_design(lat[idx], strata[idx], scaled[idx], k), y[idx], start=beta)
        if b is None or len(np.unique(strata[idx])) < k:
            continue
        boot_slopes.append(b[-1])
        boot_worth.append(_worth_of(b, lat[idx], strata[idx], scaled[idx], to_s))
        boot_curves.append(_curve_of(b, grid, strata[idx], scaled[idx]))
    curve_mid = _curve_of(beta, grid, strata, scaled)
    if boot_curves:
        band = np.quantile(np.array(boot_curves), [0.025, 0.975], axis=0)
        s_lo, s_hi = (float(v) for v in np.quantile(boot_slopes, [0.025, 0.975]))
        w_lo, w_hi = (float(v) for v in np.quantile(boot_worth, [0.025, 0.975]))
    else:
        band = np.vstack([curve_mid, curve_mid])
        s_lo = s_hi = float(beta[-1])
        w_lo = w_hi = _worth_of(beta, lat, strata, scaled, to_s)
    curve = tuple(
        CurvePoint(float(g), float(m), float(lo), float(hi))
        for g, m, lo, hi in zip(grid, curve_mid, band[0], band[1], strict=True)
    )
    worth = Worth(p99, to_s, _worth_of(beta, lat, strata, scaled, to_s), w_lo, w_hi)
    return SatisfactionFit(
        model_version, path, metric, n, mean, tuple(buckets),
        "logistic regression on latency, adjusted for prompt length by stratification; bootstrap 95% band",
        edges, float(beta[-1]), s_lo, s_hi, curve, worth,
    )  # fmt: skip


def satisfaction_by_group(
    items: Sequence[JoinedFeedback],
    *,
    metric: str = "e2e",
    target_s: float | None = None,
    bootstrap: int = 200,
) -> list[SatisfactionFit]:
    """One fit per (model version, path) of the joined feedback, on `metric`'s latency."""
    groups: dict[tuple[str, str | None], list[JoinedFeedback]] = defaultdict(list)
    for it in items:
        latency = it.duration_s if metric == "e2e" else it.ttft_s
        if latency is not None:
            groups[(it.model_version, it.path)].append(it)
    out = []
    for (version, path), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        lat = [r.duration_s if metric == "e2e" else float(r.ttft_s or 0.0) for r in rows]
        out.append(
            fit_satisfaction(
                lat,
                [r.score for r in rows],
                [r.prompt_tokens for r in rows],
                model_version=version,
                path=path,
                metric=metric,
                target_s=target_s,
                bootstrap=bootstrap,
            )
        )
    return out
