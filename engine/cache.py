"""KVCache: keys and values pre-allocated for `max_batch` slots of `max_seq_len` positions.

A slot is one running sequence. The serving runtime owns the slot bookkeeping (which slot is
free, how far each has got); the cache is only the memory, written in place by `prefill` and
`decode` and never reallocated, so a decode step allocates nothing proportional to the
context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["KVCache"]


@dataclass(frozen=True, slots=True, eq=False)
class KVCache:
    k: torch.Tensor  # [layers, max_batch, kv_heads, max_seq_len, head_dim]
    v: torch.Tensor  # same shape
    # per-layer views k[i], v[i], made once (saves two indexing ops per layer per step)
    layer_k: tuple[torch.Tensor, ...] = field(init=False)
    layer_v: tuple[torch.Tensor, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_k", tuple(self.k[i] for i in range(self.k.shape[0])))
        object.__setattr__(self, "layer_v", tuple(self.v[i] for i in range(self.v.shape[0])))

    @classmethod
    def allocate(
        cls,
        *,
        layers: int,
        max_batch: int,
        kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVCache:
        shape = (layers, max_batch, kv_heads, max_seq_len, head_dim)
        return cls(
            k=torch.zeros(shape, dtype=dtype, device=device),
            v=torch.zeros(shape, dtype=dtype, device=device),
        )

    @property
    def max_batch(self) -> int:
        return int(self.k.shape[1])

    @property
    def max_seq_len(self) -> int:
        return int(self.k.shape[3])

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
