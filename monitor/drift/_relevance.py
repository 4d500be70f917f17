"""Prompt-response relevance: the cosine between a prompt and its response, per request
and as a windowed distribution."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RELEVANCE_BUCKETS", "RelevanceComparison", "RelevanceSummary", "relevance", "summarize_relevance"]

# Histogram edges shared by the summary and the Prometheus histogram.
RELEVANCE_BUCKETS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))


def relevance(prompt_embeddings: np.ndarray, response_embeddings: np.ndarray) -> np.ndarray:
    """Row-wise cosine of unit rows: `[N]` float32."""
    return np.einsum("ij,ij->i", prompt_embeddings, response_embeddings).astype(np.float32)


@dataclass(frozen=True)
class RelevanceSummary:
    n: int
    mean: float | None  # None for an empty window
    std: float | None
    p05: float | None
    p25: float | None
    p50: float | None
    p75: float | None
    p95: float | None
    bucket_edges: tuple[float, ...]  # counts[i] covers [edges[i], edges[i+1]); the ends take the tails
    bucket_counts: tuple[int, ...]


def summarize_relevance(values: np.ndarray) -> RelevanceSummary:
    v = np.asarray(values, dtype=np.float64)
    edges = np.asarray(RELEVANCE_BUCKETS)
    clipped = np.clip(v, edges[0], edges[-1])
    counts, _ = np.histogram(clipped, bins=edges)
    if v.size == 0:
        return RelevanceSummary(
            0, None, None, None, None, None, None, None, RELEVANCE_BUCKETS, tuple(int(c) for c in counts)
        )
    q = [float(x) for x in np.quantile(v, [0.05, 0.25, 0.5, 0.75, 0.95])]
    return RelevanceSummary(
        n=int(v.size),
        mean=float(v.mean()),
        std=float(v.std()),
        p05=q[0],
        p25=q[1],
        p50=q[2],
        p75=q[3],
        p95=q[4],
        bucket_edges=RELEVANCE_BUCKETS,
        bucket_counts=tuple(int(c) for c in counts),
    )


@dataclass(frozen=True)
class RelevanceComparison:
    reference: RelevanceSummary
    current: RelevanceSummary
