"""int4 on the native decode step: the packing of quant.py's group-wise int4 weights into the
layout of the C loop (engine/csrc/int4.c, which shares int8.c's quantised activations `qact`),
made once at load.

The weights, as quant.py stores them: per row and run of G consecutive columns of K (G = 64,
or 32 where K is not a multiple of 64 or the build was made with groups of 32), 4-bit q in
0..15 with w = (q - 8) * scale + zero, i.e. q * scale + min with min = zero - 8 scale.
Against activations quantised per 64 columns (x ~ xs * a, a int8, int8.c's `qact`),
one group's share of x . w is

    scale * xs * (sum a q - 8 sum a) + zero * sum x,

so the inner loop is `vpdpbusd` of the unsigned nibbles against the signed activations, with
no sign or offset tricks, and the scale and zero are applied once per group and 16 columns.

The packed layout, per block of 16 output columns (rows of the weight) and per group: G / 8
runs of 64 bytes, run u holding columns k = 8u..8u+7 of the group as byte 4c + j = q[c][8u + j]
(low nibble) | q[c][8u + 4 + j] << 4 (c the row in the block, j < 4); then the group's 16
scales and 16 mins as fp16 (64 bytes). fp16, not the bf16 torch's kernel takes, because
llama.cpp's q4_0 and q4_1 blocks hold fp16 scales and mins: an import of those keeps them
unrounded (`scales_mins`), and an engine-made group loses nothing it had in bf16. A block
is one sequential run of memory (the hardware prefetcher follows it); one 64-byte load, two
masks and a shift feed two `vpdpbusd` per activation row.

Without AVX512-VNNI, AVX2 machines run the same layout through `vpmaddubsw` (nibbles times
signed activations cannot saturate its int16 sums); where the CPU has neither (the x86-64-v2
library) there is no int4 loop and int4 models stay on the eager path (`infersight_has_int8_dot`).
"""

from __future__ import annotations

import torch

__all__ = ["GROUPS", "Sources", "pack_int4", "plain_nibbles", "scales_mins"]

GROUPS = (64, 32)  # the group sizes the C loop reads

Sources = dict[tuple[int, int], torch.Tensor]
"""(N, K) -> `_packed_sources` of that shape: kept by the caller for one model's weights (its
experts share shapes), not for the process (a vocabulary-sized head's is N * K int32)."""


def _nibbles(weight: torch.Tensor) -> torch.Tensor:
    """uint8 [..., B] -> its nibbles [..., 2B], low nibble first."""
    return torch.stack([weight & 15, weight >> 4], dim=-1).flatten(-2)


def _probed(n: int, k: int) -> torch.Tensor:
    """For torch's packed int4 CPU layout of an [n, k] weight: the row-major index (int32) of
    the weight element each nibble of the packed bytes holds, found by packing probes (4 bits
    of every element's index per probe): nothing here assumes the layout the kernel's build chose."""
    index = torch.arange(n * k, dtype=torch.int32)
    found = torch.zeros(n * k, dtype=torch.int32)
    for shift in range(0, max(1, (n * k - 1).bit_length()), 4):
        probe = ((index >> shift) & 15).view(n, k)
        packed = torch._convert_weight_to_int4pack_for_cpu(probe, 1)
        found |= _nibbles(packed.reshape(-1)).to(torch.int32) << shift
    return found


def _tiled(n: int, k: int, rows: int) -> torch.Tensor | None:
    """`_probed(n, k)` built from a probe of one block of `rows` rows and the tail, if the layout
    packs each block of rows into its own run of bytes alike (checked on a random weight, so a
    layout that does not is probed in full instead): a vocabulary-sized head costs one block."""
    blocks, tail = divmod(n, rows)
    small = _probed(rows + tail, k)
    first, rest = small[: rows * k], small[rows * k :] - rows * k
    if bool((first >= rows * k).any()):
        return None
    step = torch.arange(blocks, dtype=torch.int32)[:, None] * (rows * k)
    found = torch.cat([(first[None, :] + step).reshape(-1), rest + blocks * rows * k])
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=torch.Generator().manual_seed(n + k))
    nib = _nibbles(torch._convert_weight_to_int4pack_for_cpu(q, 1).reshape(-1))
    return found if torch.equal(nib, q.reshape(-1)[found.long()].to(torch.uint8)) else None


def _packed_sources(n: int, k: int, sources: Sources) -> torch.Tensor:
    """`_probed(n, k)`, cached in `sources`; from one block's probe (`_tiled`) where that holds."""
    found = sources.get((n, k))
    if found is None:
        for rows in (64, 32):
            if n >= 4 * rows and (found := _tiled(n, k, rows)) is not None:
                break
        else:
            found = _probed(n, k)
        seen = torch.zeros(n * k, dtype=torch.bool)
        seen[found.long()] = True
        if not bool(seen.all()):
            raise ValueError(f"torch's packed int4 layout of [{n}, {k}] is not a permutation")
        sources[(n, k)] = found
    return found


def plain_nibbles(weight: torch.Tensor, k: int, packed: bool, sources: Sources | None = None) -> torch.Tensor:
    """An int4 weight as quant.py stores it (uint8 [N, K/2]; `packed`: the bytes of torch's
    packed kernel) -> q uint8 [N, K] in 0..15. `sources`: the packed layouts found so far."""
    n = weight.shape[0]
    nib = _nibbles(weight.reshape(-1))
    if not packed:
        return nib.view(n, k)
    q = torch.empty(n * k, dtype=torch.uint8)
    q[_packed_sources(n, k, {} if sources is None else sources).long()] = nib
    return q.view(n, k)


def scales_mins(scales_zeros: torch.Tensor) -> torch.Tensor:
    """quant.py's scales_zeros [..., K/G, N, 2] (w = (q - 8) * scale + zero) -> fp16 [..., K/G,
    N, 2] of (scale, min), w = q * scale + min, computed in fp32."""
    sz = scales_zeros.float()
    scale = sz[..., 0]
    return torch.stack([scale, sz[..., 1] - 8.0 * scale], dim=-1).to(torch.float16)


def pack_int4(q: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, int]:
    """q uint8 [N, K] in 0..15 and fp16 (scale, min) [K/G, N, 2] (`scales_mins`) -> the packed
    layout (module docstring), uint8 [ceil(N/16), K/G, G * 8 + 64] with rows past N zero, and G."""
    n, k = q.shape
    ng = mins.shape[0]
    g = k // ng
    if g not in GROUPS or g * ng != k or (k % 64 and g != 32):  # the C loop's rule (`g4`)
        raise ValueError(f"int4 groups of {g} over {k} columns are not the native loop's")
    nb = -(-n // 16)
    qp = torch.zeros(nb * 16, k, dtype=torch.uint8)
    qp[:n] = q
    # [block, row c, group, run u, half h, j] -> [block, group, u, c, j] bytes
    parts = qp.view(nb, 16, ng, g // 8, 2, 4)
    runs = (parts[:, :, :, :, 0] | (parts[:, :, :, :, 1] << 4)).permute(0, 2, 3, 1, 4)
    runs = runs.reshape(nb, ng, g * 8)
    sz = torch.zeros(ng, nb * 16, 2, dtype=torch.float16)
    sz[:, :n] = mins.to(torch.float16)
    sz = sz.view(ng, nb, 16, 2).permute(1, 0, 3, 2).contiguous()  # [block, group, scale|min, 16]
    tail = sz.view(torch.uint8).reshape(nb, ng, 64)
    return torch.cat([runs, tail], dim=-1).contiguous(), g
