"""Embeddings: the real all-MiniLM-L6-v2 from its package, offline, and a cache that never
encodes the same text twice."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from _drift_helpers import real_embedder
from infersight.monitor.drift import CachedEmbedder, SentenceTransformerEmbedder
from infersight.monitor.drift.errors import EmbedderUnavailable


class CountingEmbedder:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.seen.extend(texts)
        rng = np.random.default_rng(len(self.seen))
        rows = rng.standard_normal((len(texts), 8)).astype(np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True) if len(texts) else rows


def test_the_same_text_is_never_encoded_twice_while_cached() -> None:
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=100)
    first = cache.encode(["a", "b", "a"])
    second = cache.encode(["b", "c", "a"])
    assert inner.seen == ["a", "b", "c"]
    np.testing.assert_array_equal(first[0], first[2])
    np.testing.assert_array_equal(second[0], first[1])
    np.testing.assert_array_equal(second[2], first[0])
    assert (cache.hits, cache.misses) == (3, 3)


def test_the_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=2)
    cache.encode(["a", "b"])
    cache.encode(["a"])  # a is now the most recent
    cache.encode(["c"])  # evicts b
    assert len(cache) == 2
    cache.encode(["a", "b"])
    assert inner.seen == ["a", "b", "c", "b"]


def test_real_model_gives_unit_norm_float32_rows_offline_and_similar_texts_are_close() -> None:
    rows = real_embedder().encode(
        ["How do I top up my card?", "How can I add money to my card?", "Is there a gym?"]
    )
    assert rows.dtype == np.float32 and rows.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert rows[0] @ rows[1] > rows[0] @ rows[2] + 0.3
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_a_model_path_that_is_not_a_model_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(EmbedderUnavailable, match="not a directory"):
        SentenceTransformerEmbedder(tmp_path / "missing").encode(["x"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmbedderUnavailable):
        SentenceTransformerEmbedder(tmp_path / "empty").encode(["x"])
