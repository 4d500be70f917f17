"""A counter whose increment is a single C call, for the decorator's hot path."""

from __future__ import annotations

import itertools
from collections import deque

__all__ = ["Tally"]


class Tally:
    """A monotonic event counter.

    `incr()` is `next()` on an `itertools.count`: one C call, atomic under the GIL,
    no lock. Reading advances the same iterator, so `value()` subtracts its own
    reads; callers serialise `value()` under a lock of their own (scrapes are rare).
    """

    __slots__ = ("_it", "_reads", "incr")

    def __init__(self) -> None:
        self._it = itertools.count()
        self._reads = 0
        self.incr = self._it.__next__

    def add(self, n: int) -> None:
        """n increments at once: the iterator advanced n steps inside C (a zero-length deque
        consumes an `islice` of it), not n Python calls."""
        if n > 0:
            _consume(itertools.islice(self._it, n))

    def value(self) -> int:
        v = next(self._it) - self._reads
        self._reads += 1
        return v


_SINK: deque[int] = deque(maxlen=0)  # keeps nothing: extending it only advances an iterator
_consume = _SINK.extend
