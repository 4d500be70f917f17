"""The native kernels' huge-page arena (engine/native.py `HugePageArena`): packed weights carved
out of 2 MiB-aligned anonymous mappings advised for transparent huge pages."""

from __future__ import annotations

import itertools

import torch
from infersight.engine.native import HugePageArena, pack


def _ranges(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    return sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors)


def test_tensors_are_aligned_disjoint_and_hold_what_is_written() -> None:
    arena = HugePageArena(chunk_bytes=1 << 20)
    shapes = [(3, 5), (17, 64, 16), (1,), (1000,), (40, 40)]
    tensors = [arena.empty(s, torch.float32) for s in shapes] + [arena.empty((7, 9), torch.int8)]
    for t in tensors:
        assert t.data_ptr() % 64 == 0
        assert t.is_contiguous()
    spans = _ranges(tensors)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start  # no two tensors share a byte
    for i, t in enumerate(tensors):
        t.fill_(i + 1)
    for i, t in enumerate(tensors):
        assert torch.all(t == i + 1)


def test_small_tensors_share_a_chunk_and_large_ones_get_their_own_mapping() -> None:
    arena = HugePageArena(chunk_bytes=1 << 20)
    a, b = arena.empty((1000,)), arena.empty((1000,))
    assert 0 < b.data_ptr() - a.data_ptr() < (1 << 20)  # bump-allocated in one chunk
    big = arena.empty((1 << 18,))  # 1 MiB: over a quarter of a chunk
    assert big.data_ptr() % (2 << 20) == 0  # a mapping of its own, at a 2 MiB boundary
    c = arena.empty((10,))
    assert 0 < c.data_ptr() - b.data_ptr() < (1 << 20)  # the chunk goes on after it


def test_a_tensor_keeps_its_chunk_alive_after_the_arena_is_gone() -> None:
    arena = HugePageArena(chunk_bytes=1 << 20)
    t = arena.empty((256,))
    t.copy_(torch.arange(256, dtype=torch.float32))
    del arena
    for _ in range(3):
        torch.empty(1 << 20).fill_(7.0)  # reuse freed memory if the chunk had been unmapped
    assert torch.equal(t, torch.arange(256, dtype=torch.float32))


def test_packing_into_the_arena_gives_the_same_layout() -> None:
    torch.manual_seed(0)
    w = torch.randn(37, 24)  # a tail block of 5 rows
    arena = HugePageArena()
    assert torch.equal(pack(w, arena), pack(w))
