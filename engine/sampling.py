"""Next-token selection: greedy at temperature 0, else temperature + nucleus (top-p) sampling;
and one token per running request of a serving step (`sample_requests`).

A step's greedy rows take one `argmax` over the whole batch. Sampled rows are grouped by
(temperature, top_p, generator): requests without a seed share the runtime's generator and
sample together; a seeded request has its own generator, so its tokens do not depend on which
other requests share its batch. Nothing here reads the device: the caller reads all of a
step's tokens at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from .errors import InvalidSamplingParams

__all__ = ["Sampled", "check_sampling", "sample", "sample_requests"]


class Sampled(Protocol):
    """What `sample_requests` reads of a running request (runtime_loop.Request)."""

    temperature: float
    top_p: float
    generator: torch.Generator | None


def check_sampling(temperature: float, top_p: float) -> None:
    """Raise `InvalidSamplingParams` unless temperature >= 0 and 0 < top_p <= 1."""
    if not (temperature >= 0.0):  # also refuses NaN
        raise InvalidSamplingParams(f"temperature must be >= 0, got {temperature!r}")
    if not (0.0 < top_p <= 1.0):
        raise InvalidSamplingParams(f"top_p must be in (0, 1], got {top_p!r}")


def sample(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """logits [B, V] -> token ids [B] (int64). Stays on the logits' device: no host sync.

    `generator` (on the logits' device) makes sampling reproducible; greedy ignores it.
    """
    check_sampling(temperature, top_p)
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [B, V]
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the tokens more likely than it already reach top_p (keeps >= 1)
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_requests(
    logits: torch.Tensor, requests: Sequence[Sampled], shared: torch.Generator
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
