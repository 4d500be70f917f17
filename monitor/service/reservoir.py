"""A bounded reservoir of texts awaiting embedding, so drift scoring never falls behind
silently: between two drains at most `capacity` texts are kept, a uniform random sample
of all offered (Vitter's algorithm R); the others are counted as skipped."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SampledText", "TextReservoir"]


@dataclass(frozen=True, slots=True)
class SampledText:
    request_id: str
    model: str
    model_version: str
    started_at: float
    prompt: str | None
    response: str | None


class TextReservoir:
    def __init__(
        self,
        capacity: int,
        *,
        on_skip: Callable[[int], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._items: list[SampledText] = []
        self._seen = 0  # offered since the last drain
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._on_skip = on_skip
        self.offered_total = 0
        self.skipped_total = 0

    def offer(self, item: SampledText) -> None:
        skipped = 0
        with self._lock:
            self._seen += 1
            self.offered_total += 1
            if len(self._items) < self.capacity:
                self._items.append(item)
            else:
                j = self._rng.randrange(self._seen)
                if j < self.capacity:
                    self._items[j] = item
                skipped = 1  # one text (the new one or the one it replaced) will not be embedded
                self.skipped_total += 1
        if skipped and self._on_skip is not None:
            self._on_skip(skipped)

    def drain(self) -> list[SampledText]:
        with self._lock:
            items, self._items, self._seen = self._items, [], 0
        return items

    def __len__(self) -> int:
        return len(self._items)
