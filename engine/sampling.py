"""Next-token selection: greedy at temperature 0, else temperature + nucleus (top-p) sampling."""

from __future__ import annotations

import torch

from .errors import InvalidSamplingParams

__all__ = ["check_sampling", "sample"]


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
