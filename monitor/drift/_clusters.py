"""Reference clusters (fitted once) and their shares in the two windows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._explanation import ClusterShare
from ._holm import holm_adjust
from ._kmeans import assign, spherical_kmeans

__all__ = ["NOVEL_CLUSTER", "ClusterModel", "cluster_shares", "fit_clusters"]


@dataclass(frozen=True, eq=False)
class ClusterModel:
    centroids: np.ndarray  # [k, D] unit rows
    labels: tuple[str, ...]  # per cluster: the reference text nearest its centroid
    examples: tuple[tuple[str, ...], ...]  # per cluster: reference texts nearest its centroid
    reference_assignment: np.ndarray  # [m]


def default_cluster_count(n: int) -> int:
    return int(min(20, max(2, n // 50)))


def fit_clusters(
    texts: tuple[str, ...], rows: np.ndarray, *, k: int | None = None, seed: int = 0, examples: int = 3
) -> ClusterModel:
    centroids = spherical_kmeans(rows, k or default_cluster_count(rows.shape[0]), seed=seed)
    labels = assign(rows, centroids)
    sims = rows @ centroids.T  # [m, k]
    names: list[str] = []
    shown: list[tuple[str, ...]] = []
    for c in range(centroids.shape[0]):
        members = np.flatnonzero(labels == c)
        ordered = members[np.argsort(-sims[members, c], kind="stable")]
        picked = _distinct(texts, ordered, examples)
        names.append(picked[0] if picked else "")
        shown.append(picked)
    return ClusterModel(centroids, tuple(names), tuple(shown), labels)


NOVEL_CLUSTER = -1
NOVEL_LABEL = "(new: farther from the reference than its own 1% tail)"


def cluster_shares(
    model: ClusterModel,
    current_rows: np.ndarray,
    current_texts: tuple[str, ...],
    current_witness: np.ndarray,
    *,
    current_novel: np.ndarray,
    reference_novel: tuple[int, int],
    alpha: float,
    examples: int = 3,
) -> tuple[ClusterShare, ...]:
    """Shares per cluster, largest increase first.

    Current texts flagged `current_novel` form their own row (cluster -1) instead of being
    forced into the nearest reference cluster; that row's reference share is
    `reference_novel = (count, n)` measured on the held-out part of the reference.
    `current_witness` orders each cluster's current examples (highest first). Each row
    gets Fisher's exact two-sided test; Holm across the rows."""
    from scipy.stats import fisher_exact  # slow to import: only when explaining

    k = model.centroids.shape[0]
    cur_labels = assign(current_rows, model.centroids)
    cur_labels[current_novel] = k  # the novel row, last
    ref_counts = np.append(np.bincount(model.reference_assignment, minlength=k), reference_novel[0])
    cur_counts = np.bincount(cur_labels, minlength=k + 1)
    ref_totals = [int(model.reference_assignment.size)] * k + [reference_novel[1]]
    n = int(cur_counts.sum())
    p_values = [
        float(
            fisher_exact(
                [
                    [int(ref_counts[c]), ref_totals[c] - int(ref_counts[c])],
                    [int(cur_counts[c]), n - int(cur_counts[c])],
                ]
            )[1]
        )
        for c in range(k + 1)
    ]
    adjusted = holm_adjust(p_values)
    rows = []
    for c in range(k + 1):
        members = np.flatnonzero(cur_labels == c)
        ordered = members[np.argsort(-current_witness[members], kind="stable")]
        ref_share = ref_counts[c] / ref_totals[c] if ref_totals[c] else 0.0
        cur_share = cur_counts[c] / n if n else 0.0
        novel_row = c == k
        rows.append(
            ClusterShare(
                cluster=NOVEL_CLUSTER if novel_row else c,
                label=NOVEL_LABEL if novel_row else model.labels[c],
                reference_count=int(ref_counts[c]),
                current_count=int(cur_counts[c]),
                reference_share=float(ref_share),
                current_share=float(cur_share),
                change=float(cur_share - ref_share),
                p_value=p_values[c],
                p_adjusted=adjusted[c],
                significant=adjusted[c] < alpha,
                reference_examples=() if novel_row else model.examples[c],
                current_examples=_distinct(current_texts, ordered, examples),
            )
        )
    rows.sort(key=lambda r: (-r.change, r.cluster))
    return tuple(rows)


def _distinct(texts: tuple[str, ...], order: np.ndarray, limit: int) -> tuple[str, ...]:
    seen: list[str] = []
    for i in order:
        text = texts[int(i)]
        if text not in seen:
            seen.append(text)
            if len(seen) == limit:
                break
    return tuple(seen)
