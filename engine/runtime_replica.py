"""One loaded version with its own KV cache: the unit the runtime serves and swaps.

During a deploy two replicas run side by side: the new one takes every new request, the
old one keeps decoding the requests that started on it until it drains, then is dropped.
Only the runtime's loop thread touches a replica once it is serving.

Every prompt is prefilled in chunks of `prefill_block` tokens that start at multiples of
it, with the prefix cache or without: a block's keys and values are then computed by the
same operations whether the blocks before it were computed just now or copied from the
cache, which is what makes answers bit-identical with and without the cache (the cost of
chunking against one whole-prompt forward is measured in docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from .prefix_cache import PrefixCache, frequent_prefixes
from .scheduler import Request
from .step_times import StepTimes

__all__ = ["Replica"]


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
        self.max_seq_len = max_seq_len
        self.cache = model.new_cache(max_batch, max_seq_len)
        self.running: dict[int, Request] = {}  # slot -> request, in admission order
        self._free = list(range(max_batch - 1, -1, -1))  # pop() hands out slot 0 first
        self.eos_ids = _eos_ids(model)
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
        self.step_times.observe_prefill(len(request.prompt_ids), time.perf_counter() - t0)
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
        # at least the last token is always prefilled: its logits start the answer
        usable = keys[: (len(prompt) - 1) // block]
        hits = prefix.lookup(self.version, usable, count=count)  # preload is not traffic
        for i, (k, v) in enumerate(hits):
            self.model.write_kv(cache, slot, i * block, k, v)
        start = len(hits) * block
        logits = self.model.prefill_blocks(cache, slot, ids, start=start, block=block)
        fresh = [
            (keys[i], self.model.read_kv(cache, slot, i * block, (i + 1) * block))
            for i in range(len(hits), len(keys))
            if keys[i] not in prefix
        ]
        prefix.store(self.version, fresh)
        return logits

    def decode(self, requests: list[Request]) -> torch.Tensor:
        """logits[B, V]: one step for each request, fed its last token."""
        slots = torch.tensor([r.slot for r in requests], dtype=torch.long, device=self.device)
        inputs = torch.tensor([r.tokens[-1] for r in requests], dtype=torch.long, device=self.device)
        positions = torch.tensor([r.position for r in requests], dtype=torch.long, device=self.device)
        t0 = time.perf_counter()
        logits = self.model.decode(self.cache, slots, inputs, positions)
        self.step_times.observe_decode(len(requests), time.perf_counter() - t0)
        return logits

    def __repr__(self) -> str:
        return f"Replica({self.version!r}, running={len(self.running)})"


def _eos_ids(model: Any) -> frozenset[int]:
    """The end-of-sequence ids of config.json (`ModelConfig.eos_token_ids`)."""
    return frozenset(int(e) for e in model.config.eos_token_ids)
