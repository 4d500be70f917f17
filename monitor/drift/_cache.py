"""A bounded LRU cache of embeddings by text hash, in front of any `Embedder`.

Texts are keyed by a 16-byte BLAKE2b digest of their UTF-8 bytes, so the cache holds
`max_entries * (16 + 4 * D)` bytes of payload at most. One call encodes each distinct
missing text once, in one batch, in the caller's order.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ._embedding import Embedder

__all__ = ["CachedEmbedder"]


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
