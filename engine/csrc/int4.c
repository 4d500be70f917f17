/* int4 against int8 activations (builds with int8-activation loops only; elsewhere int4 models
   stay on the eager path): `p4_block` over the packed int4 layout (README.md; packed by
   native_int4.py's `pack_int4` at load). Per group of G columns (the model's group size where
   K is a multiple of 64, else 32), q in 0..15 and w = q * scale + min with scale and min fp16
   (as llama.cpp's q4_1 blocks hold theirs, so those import unrounded), so w = (q - 8) * scale +
   zero with zero = min + 8 scale, and one group's share of x . w is

       scale * xs * (sum a q - 8 sum a) + zero * sum x

   so the inner loop is `vpdpbusd` (or AVX2's `vpmaddubsw`) of the unsigned nibbles against the
   signed activations, the scale and zero applied once per group and 16 columns. */
#include "kernels.h"

#if INFERSIGHT_I8
/* row `row`'s sums over the group of G columns at k0: of its int8 activations, and of x */
static inline void group_sums(const qact *q, int64_t row, int64_t k0, int64_t G, int32_t *asum, float *xsum) {
    const int32_t *as = q->asum + row * 2 * q->nb + k0 / 32;
    const float *xs = q->xsum + row * 2 * q->nb + k0 / 32;
    *asum = G == 64 ? as[0] + as[1] : as[0];
    *xsum = G == 64 ? xs[0] + xs[1] : xs[0];
}
#endif


#if INFERSIGHT_VNNI
static inline __m512 f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)); }

/* out[r][0..15] = x_r . w[c] for r < MR, `wb` one packed int4 block over K */
static inline __attribute__((always_inline)) void p4_tile(
        const qact *q, int64_t r0, const uint8_t *wb, int64_t K, int64_t G, const int MR, float *out) {
    const int64_t ng = K / G, gbytes = G * 8 + 64;
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
        __m512 sc = f16x16((const uint16_t *)(const void *)(wg + G * 8));
        /* the centred form (q - 8) * scale + zero: the activations' rounding errors meet
           weights of -8..7 rather than 0..15 */
        __m512 zc = _mm512_fmadd_ps(_mm512_set1_ps(8.0f), sc, f16x16((const uint16_t *)(const void *)(wg + G * 8 + 32)));
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
static inline __m256 f16x8(const uint16_t *p) {
#ifdef __F16C__
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
#else
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = f16_in(p[i]);
    return _mm256_loadu_ps(f);
#endif
}

/* AVX2, the same product: 32 bytes (8 columns) per register; vpmaddubsw of the unsigned
   nibbles against the signed activations (at most 2 * 15 * 127 per pair: no saturation),
   the two halves of a run and 4 runs summed in int16 (at most 16 * 15 * 127), then
   vpmaddwd to int32. G (32 or 64) is a multiple of 4 runs of 8. */
static inline __attribute__((always_inline)) void p4_tile(
        const qact *q, int64_t r0, const uint8_t *wb, int64_t K, int64_t G, const int MR, float *out) {
    const int64_t ng = K / G, gbytes = G * 8 + 64;
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
        __m256 scl = f16x8(sz), sch = f16x8(sz + 8), eight = _mm256_set1_ps(8.0f);
        __m256 zcl = _mm256_fmadd_ps(eight, scl, f16x8(sz + 16)), zch = _mm256_fmadd_ps(eight, sch, f16x8(sz + 24));
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
void p4_block(const qact *q, int64_t r0, int64_t M, const uint8_t *wb, int64_t K, int64_t G, float *out) {
    I8_PASSES(p4_tile, wb, K, G) /* kernels.h */
}
#endif
