"""The waiting room: requests not yet running, highest priority first, FIFO within a priority.

`Request` is the runtime's own record of one request; after it leaves the queue only the
loop thread touches it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .requests import RequestHandle
    from .runtime_replica import Replica

__all__ = ["PendingQueue", "Request"]


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    priority: int
    handle: RequestHandle
    arrival: float  # time.monotonic() at submit
    path: str | None = None  # SLA routing: "fast" or "standard" (None without routing)
    # set by the loop thread once the request runs
    version: str | None = None
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    started: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    generator: torch.Generator | None = None
    replica: Replica | None = None
    finished: bool = False

    @property
    def position(self) -> int:
        """Cache position of the next token fed to the model (the last one produced)."""
        return len(self.prompt_ids) + len(self.tokens) - 1


class PendingQueue:
    """Thread-safe priority queue of requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[int, int, Request]] = []
        self._seq = itertools.count()

    def push(self, request: Request) -> None:
        with self._lock:
            heapq.heappush(self._heap, (-request.priority, next(self._seq), request))

    def pop(self) -> Request | None:
        with self._lock:
            return heapq.heappop(self._heap)[2] if self._heap else None

    def remove(self, request: Request) -> bool:
        """Take `request` out if it is still waiting; False if it already left."""
        with self._lock:
            for i, entry in enumerate(self._heap):
                if entry[2] is request:
                    self._heap[i] = self._heap[-1]
                    self._heap.pop()
                    heapq.heapify(self._heap)
                    return True
            return False

    def drain(self) -> list[Request]:
        with self._lock:
            out = [entry[2] for entry in sorted(self._heap)]
            self._heap.clear()
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)
