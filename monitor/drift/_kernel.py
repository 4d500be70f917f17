"""Embedding checks and the averaged Gaussian kernel shared by the MMD test and the witness.

On unit vectors the squared distance is `2 - 2 cos`, so every kernel here is a function of
a Gram matrix of dot products. Widths are fixed from the reference alone (median
heuristic) and several are averaged, which keeps the kernel characteristic at every scale
without choosing one from the data being tested.
"""

from __future__ import annotations

import itertools

import numpy as np

from .errors import EmbeddingMismatch

__all__ = ["BANDWIDTH_MULTIPLIERS", "as_unit_rows", "check_pair", "kernel_from_gram", "median_widths"]

# Each width is `median squared distance x multiplier`; the kernel is exp(-d² / width).
BANDWIDTH_MULTIPLIERS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)


def as_unit_rows(x: np.ndarray, what: str) -> np.ndarray:
    """`x` as C-contiguous float32 rows of unit length; refuses non-finite or zero rows."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise EmbeddingMismatch(f"{what}: expected an [N, D] array, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise EmbeddingMismatch(f"{what}: embeddings contain NaN or infinity")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if arr.shape[0] and float(norms.min()) == 0.0:
        raise EmbeddingMismatch(f"{what}: an embedding is all zeros")
    if arr.shape[0] and np.abs(norms - 1.0).max() > 1e-3:
        arr = arr / norms
    return np.ascontiguousarray(arr, dtype=np.float32)


def check_pair(reference: np.ndarray, current: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = as_unit_rows(reference, "reference")
    y = as_unit_rows(current, "current")
    if x.shape[1] != y.shape[1]:
        raise EmbeddingMismatch(f"reference has dimension {x.shape[1]}, current {y.shape[1]}")
    return x, y


def median_widths(
    reference: np.ndarray,
    multipliers: tuple[float, ...] = BANDWIDTH_MULTIPLIERS,
    *,
    max_points: int = 1000,
    seed: int = 0,
) -> tuple[float, ...]:
    """Kernel widths from the reference's median pairwise squared distance (a subsample of
    at most `max_points` rows, chosen with `seed`)."""
    x = reference
    if x.shape[0] > max_points:
        x = x[np.random.default_rng(seed).choice(x.shape[0], max_points, replace=False)]
    gram = x @ x.T
    d2 = np.maximum(2.0 - 2.0 * gram[np.triu_indices(x.shape[0], 1)], 0.0)
    median = float(np.median(d2)) if d2.size else 1.0
    if median <= 1e-6:  # a reference of (near) duplicates: fall back to the sphere's scale
        median = 1.0
    return tuple(median * m for m in multipliers)


def kernel_from_gram(gram: np.ndarray, widths: tuple[float, ...]) -> np.ndarray:
    """Mean over `widths` of exp(-d² / w) with d² = 2 - 2·gram (unit rows), float32.

    Consumes `gram` (it is overwritten). Widths that halve one another are computed by
    squaring the previous term instead of another exp, which is where the time goes.
    """
    d2 = gram
    d2 *= -2.0
    d2 += 2.0
    np.maximum(d2, 0.0, out=d2)
    ordered = sorted(widths, reverse=True)
    term = np.exp(d2 / np.float32(-ordered[0]))
    total = term.copy()
    for prev, width in itertools.pairwise(ordered):
        if abs(prev / width - 2.0) < 1e-9:
            np.multiply(term, term, out=term)
        else:
            np.exp(d2 / np.float32(-width), out=term)
        total += term
    total /= np.float32(len(ordered))
    return total
