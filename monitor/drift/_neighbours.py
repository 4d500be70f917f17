"""Nearest-neighbour distances (1 - cosine) to a bank of unit rows, in bounded blocks,
and the deterministic bank / calibration split of a reference."""

from __future__ import annotations

import numpy as np

__all__ = ["nearest", "split_reference"]


def nearest(queries: np.ndarray, bank: np.ndarray, *, block: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """`(distance, index)`: for each query row its smallest `1 - cos` to a bank row and that row."""
    dist = np.empty(queries.shape[0], dtype=np.float32)
    index = np.empty(queries.shape[0], dtype=np.int64)
    for start in range(0, queries.shape[0], block):
        sims = queries[start : start + block] @ bank.T  # [b, bank]
        best = sims.argmax(axis=1)
        index[start : start + block] = best
        dist[start : start + block] = 1.0 - sims[np.arange(sims.shape[0]), best]
    return np.maximum(dist, 0.0), index


def split_reference(n: int, calibration_fraction: float, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`(bank_rows, calibration_rows)` of a reference of `n` rows: a seeded random split,
    each side at least one row."""
    order = np.random.default_rng(seed).permutation(n)
    n_cal = min(max(round(n * calibration_fraction), 1), n - 1)
    return np.sort(order[n_cal:]), np.sort(order[:n_cal])
