"""Cosine (spherical) k-means with k-means++ seeding: deterministic for a seed."""

from __future__ import annotations

import numpy as np

__all__ = ["assign", "spherical_kmeans"]


def assign(rows: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Index of the most similar centroid for each unit row."""
    if rows.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return np.asarray((rows @ centroids.T).argmax(axis=1), dtype=np.int64)


def spherical_kmeans(rows: np.ndarray, k: int, *, seed: int = 0, iterations: int = 50) -> np.ndarray:
    """`[k', D]` unit centroids (k' = min(k, number of distinct rows)) of unit `rows`."""
    n = rows.shape[0]
    k = max(1, min(k, n))
    rng = np.random.default_rng(seed)
    centroids = np.empty((k, rows.shape[1]), dtype=np.float32)
    centroids[0] = rows[rng.integers(n)]
    dist = 1.0 - rows @ centroids[0]  # [n] distance to the nearest chosen centroid
    chosen = 1
    while chosen < k:
        weights = np.maximum(dist, 0.0) ** 2
        total = float(weights.sum())
        if total <= 0.0:  # fewer distinct rows than k
            break
        centroids[chosen] = rows[rng.choice(n, p=weights / total)]
        dist = np.minimum(dist, 1.0 - rows @ centroids[chosen])
        chosen += 1
    centroids = centroids[:chosen]
    labels = assign(rows, centroids)
    for _ in range(iterations):
        onehot = np.zeros((centroids.shape[0], n), dtype=np.float32)
        onehot[labels, np.arange(n)] = 1.0
        sums = onehot @ rows  # [k, D]
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        empty = norms[:, 0] == 0.0
        sums[~empty] /= norms[~empty]
        sums[empty] = centroids[empty]  # an emptied cluster keeps its centroid
        centroids = sums.astype(np.float32)
        new = assign(rows, centroids)
        if np.array_equal(new, labels):
            break
        labels = new
    return centroids
