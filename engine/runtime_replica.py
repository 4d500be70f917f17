"""One loaded version with its own KV cache: the unit the runtime serves and swaps.

During a deploy two replicas run side by side: the new one takes every new request, the
old one keeps decoding the requests that started on it until it drains, then is dropped.
Only the runtime's loop thread touches a replica once it is serving.
"""

from __future__ import annotations

from typing import Any

import torch

from .scheduler import Request

__all__ = ["Replica"]


class Replica:
    def __init__(self, version: str, model: Any, *, max_batch: int, max_seq_len: int) -> None:
        self.version = version
        self.model = model
        self.max_batch = max_batch
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
        return bool(self._free)

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
        ids = torch.tensor(request.prompt_ids, dtype=torch.long, device=self.device)
        return self.model.prefill(self.cache, request.slot, ids)

    def decode(self, requests: list[Request]) -> torch.Tensor:
        """logits[B, V]: one step for each request, fed its last token."""
        slots = torch.tensor([r.slot for r in requests], dtype=torch.long, device=self.device)
        inputs = torch.tensor([r.tokens[-1] for r in requests], dtype=torch.long, device=self.device)
        positions = torch.tensor([r.position for r in requests], dtype=torch.long, device=self.device)
        return self.model.decode(self.cache, slots, inputs, positions)

    def __repr__(self) -> str:
        return f"Replica({self.version!r}, running={len(self.running)})"


def _eos_ids(model: Any) -> frozenset[int]:
    """The end-of-sequence ids of config.json (`ModelConfig.eos_token_ids`)."""
    return frozenset(int(e) for e in model.config.eos_token_ids)
