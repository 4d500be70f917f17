"""int4 on the native decode step: the C loop (spliced into native_source.py's SOURCE after the
int8 loops, whose quantised activations `qact` it shares) and the packing of quant.py's
group-wise int4 weights into its layout, made once at load.

The weights, as quant.py stores them: per row and run of G consecutive columns of K (G = 64,
or 32 where K is not a multiple of 64), 4-bit q in 0..15 with w = (q - 8) * scale + zero.
Against activations quantised per 64 columns (x ~ xs * a, a int8, native_int8.py's `qact`),
one group's share of x . w is

    scale * xs * (sum a q - 8 sum a) + zero * sum x,

so the inner loop is `vpdpbusd` of the unsigned nibbles against the signed activations, with
no sign or offset tricks, and the scale and zero are applied once per group and 16 columns.

The packed layout, per block of 16 output columns (rows of the weight) and per group: G / 8
runs of 64 bytes, run u holding columns k = 8u..8u+7 of the group as byte 4c + j = q[c][8u + j]
(low nibble) | q[c][8u + 4 + j] << 4 (c the row in the block, j < 4); then the group's 16
scales and 16 zeros as bf16 (64 bytes). A block is one sequential run of memory (the hardware
prefetcher follows it); one 64-byte load, two masks and a shift feed two `vpdpbusd` per
activation row.

Without AVX512-VNNI, AVX2 machines run the same layout through `vpmaddubsw` (nibbles times
signed activations cannot saturate its int16 sums); where the CPU has neither the library has
no int4 loop and int4 models stay on the eager path (`infersight_has_int8_dot`).
"""

from __future__ import annotations

import torch

__all__ = ["INT4_SOURCE", "Sources", "pack_int4", "plain_nibbles"]

INT4_SOURCE = r"""
#if INFERSIGHT_I8
/* G for a reduction size K, as quant.py's int4_group_size chooses it */
static inline int64_t g4(int64_t K) { return K % 64 == 0 ? 64 : 32; }

/* bytes of one packed int4 block of 16 columns over K */
static inline int64_t p4_block_bytes(int64_t K) { return (K / g4(K)) * (g4(K) * 8 + 64); }

/* row `row`'s sums over the group of G columns at k0: of its int8 activations, and of x */
static inline void group_sums(const qact *q, int64_t row, int64_t k0, int64_t G, int32_t *asum, float *xsum) {
    const int32_t *as = q->asum + row * 2 * q->nb + k0 / 32;
    const float *xs = q->xsum + row * 2 * q->nb + k0 / 32;
    *asum = G == 64 ? as[0] + as[1] : as[0];
    *xsum = G == 64 ? xs[0] + xs[1] : xs[0];
}
#endif

#if INFERSIGHT_VNNI
static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* out[r][0..15] = x_r . w[c] for r < MR, `wb` one packed int4 block over K */
static inline __attribute__((always_inline)) void p4_tile(
        const qact *q, int64_t r0, const uint8_t *wb, int64_t K, const int MR, float *out) {
    const int64_t G = g4(K), ng = K / G, gbytes = G * 8 + 64;
    const __m512i lo = _mm512_set1_epi8(0x0f);
    __m512 acc[4];
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = wb + g * gbytes;
        const int64_t k0 = g * G;
        __m512i ia[4], ib[4];
        for (int r = 0; r < MR; r++) ia[r] = ib[r] = _mm512_setzero_si512();
        for (int64_t u = 0; u < G / 8; u++) {
            __m512i v = _mm512_loadu_si512((const void *)(wg + u * 64));
            __m512i w0 = _mm512_and_si512(v, lo), w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo);
            for (int r = 0; r < MR; r++) {
                const int8_t *a = q->as + (r0 + r) * q->Kp + k0 + 8 * u;
                ia[r] = _mm512_dpbusd_epi32(ia[r], w0, _mm512_set1_epi32(load4(a)));
                ib[r] = _mm512_dpbusd_epi32(ib[r], w1, _mm512_set1_epi32(load4(a + 4)));
            }
        }
        __m512 sc = bf16x16((const uint16_t *)(const void *)(wg + G * 8));
        __m512 zc = bf16x16((const uint16_t *)(const void *)(wg + G * 8 + 32));
        for (int r = 0; r < MR; r++) {
            int64_t row = r0 + r;
            int32_t asum;
            float xsum;
            group_sums(q, row, k0, G, &asum, &xsum);
            __m512i d = _mm512_sub_epi32(_mm512_add_epi32(ia[r], ib[r]), _mm512_set1_epi32(8 * asum));
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(q->s[row * q->nb + k0 / 64]));
            acc[r] = _mm512_fmadd_ps(zc, _mm512_set1_ps(xsum), _mm512_fmadd_ps(f, sc, acc[r]));
        }
    }
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(out + r * 16, acc[r]);
}
#elif INFERSIGHT_I8
static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)), 16));
}

/* AVX2, the same product: 32 bytes (8 columns) per register; vpmaddubsw of the unsigned
   nibbles against the signed activations (at most 2 * 15 * 127 per pair: no saturation),
   the two halves of a run and 4 runs summed in int16 (at most 16 * 15 * 127), then
   vpmaddwd to int32. G (32 or 64) is a multiple of 4 runs of 8. */
static inline __attribute__((always_inline)) void p4_tile(
        const qact *q, int64_t r0, const uint8_t *wb, int64_t K, const int MR, float *out) {
    const int64_t G = g4(K), ng = K / G, gbytes = G * 8 + 64;
    const __m256i lo4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 al[2], ah[2];
    for (int r = 0; r < MR; r++) al[r] = ah[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *wg = wb + g * gbytes;
        const int64_t k0 = g * G;
        __m256i il[2], ih[2];
        for (int r = 0; r < MR; r++) il[r] = ih[r] = _mm256_setzero_si256();
        for (int64_t u0 = 0; u0 < G / 8; u0 += 4) { /* 4 runs summed in int16: at most 4 x 7620 */
            __m256i sl[2], sh[2];
            for (int r = 0; r < MR; r++) sl[r] = sh[r] = _mm256_setzero_si256();
            for (int64_t u = u0; u < u0 + 4; u++) {
                __m256i vl = _mm256_loadu_si256((const __m256i *)(const void *)(wg + u * 64));
                __m256i vh = _mm256_loadu_si256((const __m256i *)(const void *)(wg + u * 64 + 32));
                __m256i l0 = _mm256_and_si256(vl, lo4), l1 = _mm256_and_si256(_mm256_srli_epi16(vl, 4), lo4);
                __m256i h0 = _mm256_and_si256(vh, lo4), h1 = _mm256_and_si256(_mm256_srli_epi16(vh, 4), lo4);
                for (int r = 0; r < MR; r++) {
                    const int8_t *a = q->as + (r0 + r) * q->Kp + k0 + 8 * u;
                    __m256i b0 = _mm256_set1_epi32(load4(a)), b1 = _mm256_set1_epi32(load4(a + 4));
                    sl[r] = _mm256_add_epi16(sl[r], _mm256_add_epi16(_mm256_maddubs_epi16(l0, b0), _mm256_maddubs_epi16(l1, b1)));
                    sh[r] = _mm256_add_epi16(sh[r], _mm256_add_epi16(_mm256_maddubs_epi16(h0, b0), _mm256_maddubs_epi16(h1, b1)));
                }
            }
            for (int r = 0; r < MR; r++) {
                il[r] = _mm256_add_epi32(il[r], _mm256_madd_epi16(sl[r], ones));
                ih[r] = _mm256_add_epi32(ih[r], _mm256_madd_epi16(sh[r], ones));
            }
        }
        const uint16_t *sz = (const uint16_t *)(const void *)(wg + G * 8);
        __m256 scl = bf16x8(sz), sch = bf16x8(sz + 8), zcl = bf16x8(sz + 16), zch = bf16x8(sz + 24);
        for (int r = 0; r < MR; r++) {
            int64_t row = r0 + r;
            int32_t asum;
            float xsum;
            group_sums(q, row, k0, G, &asum, &xsum);
            __m256i off = _mm256_set1_epi32(8 * asum);
            __m256 xsv = _mm256_set1_ps(xsum), sv = _mm256_set1_ps(q->s[row * q->nb + k0 / 64]);
            __m256 fl = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(il[r], off)), sv);
            __m256 fh = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ih[r], off)), sv);
            al[r] = _mm256_fmadd_ps(zcl, xsv, _mm256_fmadd_ps(fl, scl, al[r]));
            ah[r] = _mm256_fmadd_ps(zch, xsv, _mm256_fmadd_ps(fh, sch, ah[r]));
        }
    }
    for (int r = 0; r < MR; r++) {
        _mm256_storeu_ps(out + r * 16, al[r]);
        _mm256_storeu_ps(out + r * 16 + 8, ah[r]);
    }
}
#endif

#if INFERSIGHT_I8

/* out [M][16]: packed int4 block `wb` over K for rows r0..r0+M-1 of the quantised activations */
static void p4_block(const qact *q, int64_t r0, int64_t M, const uint8_t *wb, int64_t K, float *out) {
    I8_PASSES(p4_tile, wb, K) /* native_int8.py's */
}
#endif
"""

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


def pack_int4(q: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] in 0..15 and quant.py's scales_zeros [K/G, N, 2] -> the packed layout
    (module docstring), uint8 [ceil(N/16), K/G, G * 8 + 64]; rows past N zero."""
    n, k = q.shape
    ng = scales_zeros.shape[0]
    g = k // ng
    if g != (64 if k % 64 == 0 else 32) or g * ng != k:  # the C loop's rule (`g4`)
        raise ValueError(f"int4 groups of {g} over {k} columns are not the native loop's")
    nb = -(-n // 16)
    qp = torch.zeros(nb * 16, k, dtype=torch.uint8)
    qp[:n] = q
    # [block, row c, group, run u, half h, j] -> [block, group, u, c, j] bytes
    parts = qp.view(nb, 16, ng, g // 8, 2, 4)
    runs = (parts[:, :, :, :, 0] | (parts[:, :, :, :, 1] << 4)).permute(0, 2, 3, 1, 4)
    runs = runs.reshape(nb, ng, g * 8)
    sz = torch.zeros(ng, nb * 16, 2, dtype=torch.bfloat16)
    sz[:, :n] = scales_zeros.to(torch.bfloat16)
    sz = sz.view(ng, nb, 16, 2).permute(1, 0, 3, 2).contiguous()  # [block, group, scale|zero, 16]
    tail = sz.view(torch.uint8).reshape(nb, ng, 64)
    return torch.cat([runs, tail], dim=-1).contiguous()
