"""Sampling one token per running request, batched where the requests allow it.

Greedy rows (temperature 0) take one `argmax` over the whole batch. Sampled rows are
grouped by (temperature, top_p, generator): requests without a seed share the runtime's
generator and sample together; a seeded request has its own generator, so its tokens
do not depend on which other requests share its batch. Nothing here reads the device:
the caller reads all of a step's tokens at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .sampling import sample
from .scheduler import Request

__all__ = ["sample_requests"]


def sample_requests(
    logits: torch.Tensor, requests: Sequence[Request], shared: torch.Generator
) -> torch.Tensor:
    """logits[B, V] for `requests` (row i is requests[i]) -> LongTensor[B] on the same device."""
    greedy = logits.argmax(dim=-1)  # [B]
    groups: dict[tuple[float, float, int], list[int]] = {}
    generators: dict[int, torch.Generator] = {}
    for row, request in enumerate(requests):
        if request.temperature <= 0.0:
            continue
        generator = request.generator if request.generator is not None else shared
        generators[id(generator)] = generator
        groups.setdefault((request.temperature, request.top_p, id(generator)), []).append(row)
    if not groups:
        return greedy
    out = greedy.clone()
    for (temperature, top_p, gen_id), rows in groups.items():
        index = torch.tensor(rows, device=logits.device)
        picked = sample(
            logits.index_select(0, index), temperature=temperature, top_p=top_p, generator=generators[gen_id]
        )
        out.index_copy_(0, index, picked.reshape(-1).to(out.dtype))
    return out
