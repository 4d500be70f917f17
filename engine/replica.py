"""Where a request waits and what runs it: the runtime's own record of a request (`Request`),
the waiting room (`PendingQueue`, highest priority first), and the replica (`Replica`: one
loaded version with its own KV cache) with what only it does: admitting into batch slots,
the chunked prefill through the prefix cache, preloading that cache, and one decode step.

The loop thread (runtime_loop.py) drives these; once a request leaves its queue, only the
loop thread touches it and the replica it runs on.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .prefix_cache import PrefixCache, frequent_prefixes
from .step_times import StepTimes

if TYPE_CHECKING:
    from .requests import RequestHandle

__all__ = ["PendingQueue", "Replica", "Request"]

# ==============================================================================================
# The waiting room: requests not yet running, highest priority first, FIFO within a priority.
# `Request` is the runtime's own record of one request; after it leaves the queue only the
# loop thread touches it.
# ==============================================================================================


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
    user: str | None = None  # who asked (admission's fair share of the queue; None: nobody's)
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
    shadow: bool = False  # a pair's other answer, never sent to a client (runtime_shadow.py)
    # a pair's side (runtime_shadow.py): the sum of its tokens' log-probabilities at temperature
    # 1 so far; None for every other request, which then pays nothing for it
    logprob: float | None = None
    others_s: float = 0.0  # of its life, the seconds spent on other versions' forwards

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

    def count_at_least(self, priority: int) -> int:
        """Requests waiting with `priority` or higher: those served before a new one of it."""
        with self._lock:
            return sum(1 for entry in self._heap if -entry[0] >= priority)

    def waiting_of(self, user: str) -> tuple[int, int]:
        """(requests of `user` waiting, distinct other users with requests waiting)."""
        with self._lock:
            mine = 0
            others: set[str | None] = set()
            for entry in self._heap:
                if entry[2].user == user:
                    mine += 1
                else:
                    others.add(entry[2].user)
            return mine, len(others)

    def drain(self) -> list[Request]:
        with self._lock:
            out = [entry[2] for entry in sorted(self._heap)]
            self._heap.clear()
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)


# ==============================================================================================
# A replica: one loaded version with its own KV cache, the unit the runtime serves and swaps.
#
# During a deploy two replicas run side by side: the new one takes every new request, the
# old one keeps decoding the requests that started on it until it drains, then is dropped.
# Only the runtime's loop thread touches a replica once it is serving.
# Every prompt is prefilled in chunks of `prefill_block` tokens that start at multiples of
# it, with the prefix cache or without: a block's keys and values are then computed by the
# same operations whether the blocks before it were computed just now or copied from the
# cache, which is what makes answers bit-identical with and without the cache (the cost of
# chunking against one whole-prompt forward is measured in docs/benchmarks/serving.md).
# ==============================================================================================


class Replica:
    def __init__(
        self,
        version: str,
        model: Any,
        *,
        max_batch: int,
        max_seq_len: int,
        prefix: PrefixCache | None = None,
        prefill_block: int = 64,
    ) -> None:
        self.version = version
        self.prefix = prefix
        # the chunk of a prefill: the prefix cache's block when there is one
        self.prefill_block = prefix.block_tokens if prefix is not None else prefill_block
        self.model = model
        self.max_batch = max_batch
        self.cap = max_batch  # requests it runs at once; SLA routing lowers it to hold a path's SLA
        self.step_times = StepTimes()  # measured decode/prefill costs, read by the router
        self.busy_s = 0.0  # seconds of prefill and decode so far: the loop charges it per step
        self.max_seq_len = max_seq_len
        self.cache = model.new_cache(max_batch, max_seq_len)
        self.running: dict[int, Request] = {}  # slot -> request, in admission order
        self._free = list(range(max_batch - 1, -1, -1))  # pop() hands out slot 0 first
        self.eos_ids = frozenset(int(e) for e in model.config.eos_token_ids)  # config.json's
        self.shadow_queue = PendingQueue()  # pairs' shadows to run on this version (runtime_shadow.py)
        self.vocab_size = int(model.config.vocab_size)
        device = getattr(model, "device", None)
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    @property
    def has_free_slot(self) -> bool:
        return bool(self._free) and len(self.running) < self.cap

    def admit(self, request: Request) -> None:
        request.slot = self._free.pop()
        request.version = self.version
        self.running[request.slot] = request

    def release(self, request: Request) -> None:
        if self.running.get(request.slot) is request:
            del self.running[request.slot]
            self._free.append(request.slot)

    def prefill(self, request: Request) -> torch.Tensor:
        """logits[V] after the prompt, written into the request's slot."""
        t0 = time.perf_counter()
        logits = self._prefill(self.cache, request.slot, request.prompt_ids)
        took = time.perf_counter() - t0
        self.step_times.observe_prefill(len(request.prompt_ids), took)
        self.busy_s += took
        return logits

    def prefill_uncached(self, slot: int, prompt: Sequence[int]) -> torch.Tensor:
        """The same chunked prefill into `slot`, leaving the prefix cache alone (warm-up)."""
        ids = torch.tensor(list(prompt), dtype=torch.long, device=self.device)
        return self.model.prefill_blocks(self.cache, slot, ids, start=0, block=self.prefill_block)

    def preload(self, prompts: Sequence[Sequence[int]], *, top: int | None = None) -> int:
        """Prefill into the prefix cache, before (or beside) serving, either every prompt
        (`top` None) or the `top` most frequent block prefixes among them (recorded
        traffic: `frequent_prefixes`) -> the prompt tokens of the distinct blocks covered."""
        if self.prefix is None:
            return 0
        block = self.prefix.block_tokens
        lists = [[int(t) for t in prompt][: self.max_seq_len] for prompt in prompts]
        if top is not None:
            lists = frequent_prefixes(lists, block, top)
        scratch = None
        covered: set[str] = set()
        for ids in lists:
            if len(ids) < block:
                continue
            if scratch is None:
                scratch = self.model.new_cache(1, self.max_seq_len)
            self._prefill(scratch, 0, ids, count=False)
            covered.update(self.prefix.keys(self.version, ids))
        return len(covered) * block

    def _prefill(self, cache: Any, slot: int, prompt: Sequence[int], *, count: bool = True) -> torch.Tensor:
        ids = torch.tensor(prompt, dtype=torch.long, device=self.device)
        prefix = self.prefix
        block = self.prefill_block
        if prefix is None:
            return self.model.prefill_blocks(cache, slot, ids, start=0, block=block)
        keys = prefix.keys(self.version, prompt)
        # each block's token ids: what the shared tier seals it to
        spans = [prompt[i * block : (i + 1) * block] for i in range(len(keys))]
        # at least the last token is always prefilled: its logits start the answer
        usable = keys[: (len(prompt) - 1) // block]
        hits = prefix.lookup(self.version, usable, count=count, tokens=spans)  # preload is not traffic
        for i, (k, v) in enumerate(hits):
            self.model.write_kv(cache, slot, i * block, k, v)
        start = len(hits) * block
        logits = self.model.prefill_blocks(cache, slot, ids, start=start, block=block)
        new = [i for i in range(len(hits), len(keys)) if keys[i] not in prefix]
        fresh = [(keys[i], self.model.read_kv(cache, slot, i * block, (i + 1) * block)) for i in new]
        prefix.store(self.version, fresh, tokens=[spans[i] for i in new])
        return logits

    def decode(self, requests: list[Request]) -> torch.Tensor:
        """logits[B, V]: one step for each request, fed its last token."""
        slots = torch.tensor([r.slot for r in requests], dtype=torch.long, device=self.device)
        inputs = torch.tensor([r.tokens[-1] for r in requests], dtype=torch.long, device=self.device)
        positions = torch.tensor([r.position for r in requests], dtype=torch.long, device=self.device)
        t0 = time.perf_counter()
        logits = self.model.decode(self.cache, slots, inputs, positions)
        took = time.perf_counter() - t0
        self.step_times.observe_decode(len(requests), took)
        self.busy_s += took
        return logits

    def __repr__(self) -> str:
        return f"Replica({self.version!r}, running={len(self.running)})"
