/* The int8 loops: the weight-dequantising product (`rows8`: 4 int8 weight rows against up to 4
   fp32 activation rows per pass, prefetching four row-quads ahead: the int8 [N, K] rows are
   short runs the hardware prefetcher does not follow), the activations' quantisation per 64
   columns (`quantize_row`, into a `qact`), and, where the build has int8-activation loops
   (AVX512-VNNI, or AVX2), the int8-activation product over the packed copy (`p8_block`:
   one `vpdpbusd` per 64 weights and row with 16 output columns per register).

   fp8 weight-only rows (`rowsf8`) are the same loop over float8 e4m3 bytes: each byte b is
   decoded with bit operations as the fp16 value (b & 0x80) << 8 | (b & 0x7f) << 7, which is
   exactly 2^-8 times its e4m3 value, subnormals included (fp16's exponent bias is 8 more than
   e4m3's; `vcvtph2ps` widens it), and the 2^8 is folded into the row's scale. The plain C
   loop decodes through `fp8_in`, the definition the vector loops are tested against. The
   NaN bytes (0x7f, 0xff) are not decoded as NaN: the quantizer never writes them. fp8.c has
   the faster loop over a packed copy of the same bytes, which builds with AVX2 or AVX512-BF16
   take where a model's bytes allow it. */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__))
/* 8 weight bytes as floats: int8, or e4m3 times 2^-8 (`F8`) */
static inline __attribute__((always_inline)) __m256 wide8(const int8_t *p, const int F8) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
    if (!F8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
#ifdef __F16C__
    __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(b), 7);
    h = _mm_add_epi16(h, _mm_and_si128(h, _mm_set1_epi16(0x4000)));
    return _mm256_cvtph_ps(h);
#else
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = fp8_in((uint8_t)p[i]) / 256.0f;
    return _mm256_loadu_ps(f);
#endif
}
#endif

/* out[r * 16 + c] = s[c] * x_r . w[c] for r < MR, c < 4, w int8 (or, `F8`, e4m3) rows K apart
   (row c0 + c of the caller's 16-column block; rows past `nc` repeat the last, their results
   unused). */
static inline __attribute__((always_inline)) void quad8(
        const float *x, int64_t ldx, const int8_t *w, const float *s, int64_t nc, int64_t K,
        const int MR, const int F8, float *out) {
    const int8_t *rw[4];
    for (int c = 0; c < 4; c++) rw[c] = w + (c < nc ? c : nc - 1) * K;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    __m512 acc[4][4];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    /* e4m3: 32 bytes per row at a time, decoded in 16-bit lanes (one shift, and, add for 32
       weights), then widened in two halves; int8: 16 at a time, widened straight to fp32 */
    for (int64_t k = 0; F8 && k < K; k += 32) {
        __mmask32 km = K - k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1ull << (K - k)) - 1u);
        __m512 wl[4], wh[4];
        for (int c = 0; c < 4; c++) {
            if ((k & 63) == 0) _mm_prefetch((const char *)(rw[c] + k + 16 * K), _MM_HINT_T0);
            __m512i h = _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(km, rw[c] + k)), 7);
            h = _mm512_add_epi16(h, _mm512_and_si512(h, _mm512_set1_epi16(0x4000)));
            wl[c] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
            wh[c] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
        }
        for (int r = 0; r < MR; r++) {
            __m512 xl = _mm512_maskz_loadu_ps((__mmask16)km, x + r * ldx + k);
            __m512 xh = _mm512_maskz_loadu_ps((__mmask16)(km >> 16), x + r * ldx + k + 16);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(xh, wh[c], _mm512_fmadd_ps(xl, wl[c], acc[r][c]));
        }
    }
    for (int64_t k = 0; !F8 && k < K; k += 16) {
        __mmask16 km = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        __m512 wv[4];
        for (int c = 0; c < 4; c++) {
            if ((k & 63) == 0) _mm_prefetch((const char *)(rw[c] + k + 16 * K), _MM_HINT_T0);
            wv[c] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(km, rw[c] + k)));
        }
        for (int r = 0; r < MR; r++) {
            __m512 xv = _mm512_maskz_loadu_ps(km, x + r * ldx + k);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    const float unit = F8 ? 256.0f : 1.0f; /* e4m3 was decoded as 2^-8 times its value */
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < nc; c++) out[r * 16 + c] = s[c] * unit * _mm512_reduce_add_ps(acc[r][c]);
#elif defined(__AVX2__) && defined(__FMA__)
    /* two columns at a time (16 ymm registers hold 2 x MR sums, 2 weights and x) */
    for (int c0 = 0; c0 < 4; c0 += 2) {
        __m256 acc[4][2];
        for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
            __m256 wv[2];
            for (int c = 0; c < 2; c++) {
                if ((k & 63) == 0) _mm_prefetch((const char *)(rw[c0 + c] + k + 16 * K), _MM_HINT_T0);
                wv[c] = wide8(rw[c0 + c] + k, F8);
            }
            for (int r = 0; r < MR; r++) {
                __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
                for (int c = 0; c < 2; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
            }
        }
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < 2 && c0 + c < nc; c++) {
                float a = hsum8(acc[r][c]);
                if (F8) {
                    a *= 256.0f; /* e4m3 was decoded as 2^-8 times its value */
                    for (int64_t t = k; t < K; t++) a += x[r * ldx + t] * fp8_in((uint8_t)rw[c0 + c][t]);
                } else {
                    for (int64_t t = k; t < K; t++) a += x[r * ldx + t] * (float)rw[c0 + c][t];
                }
                out[r * 16 + c0 + c] = s[c0 + c] * a;
            }
    }
#else
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < nc; c++) {
            float a = 0.0f;
            for (int64_t k = 0; k < K; k++)
                a += x[r * ldx + k] * (F8 ? fp8_in((uint8_t)rw[c][k]) : (float)rw[c][k]);
            out[r * 16 + c] = s[c] * a;
        }
#endif
}

/* out [M][16]: rows n0..n0+nr-1 (nr <= 16) of a weight [N, K] of int8 (or, `F8`, e4m3 bytes)
   with scales [N], for M rows of x */
static inline __attribute__((always_inline)) void rows_q8(
        const float *x, int64_t ldx, int64_t M, const int8_t *w, const float *s,
        int64_t n0, int64_t nr, int64_t K, const int F8, float *out) {
    for (int64_t r = 0; r < M; r += 4) {
        int64_t n = M - r < 4 ? M - r : 4;
        for (int64_t c = 0; c < nr; c += 4) {
            const int8_t *wc = w + (n0 + c) * K;
            const float *sc = s + n0 + c, *xr = x + r * ldx;
            int64_t nc = nr - c < 4 ? nr - c : 4;
            float *o = out + r * 16 + c;
            switch (n) {
                case 1: quad8(xr, ldx, wc, sc, nc, K, 1, F8, o); break;
                case 2: quad8(xr, ldx, wc, sc, nc, K, 2, F8, o); break;
                case 3: quad8(xr, ldx, wc, sc, nc, K, 3, F8, o); break;
                default: quad8(xr, ldx, wc, sc, nc, K, 4, F8, o); break;
            }
        }
    }
}

void rows8(const float *x, int64_t ldx, int64_t M, const int8_t *w, const float *s,
           int64_t n0, int64_t nr, int64_t K, float *out) {
    rows_q8(x, ldx, M, w, s, n0, nr, K, 0, out);
}

void rowsf8(const float *x, int64_t ldx, int64_t M, const uint8_t *w, const float *s,
            int64_t n0, int64_t nr, int64_t K, float *out) {
    rows_q8(x, ldx, M, (const int8_t *)w, s, n0, nr, K, 1, out);
}

qact qact_at(char **at, int64_t rows, int64_t K) {
    qact q;
    q.nb = (K + 63) / 64;
    q.Kp = q.nb * 64;
    const int64_t area = QACT_AREA * rows * q.Kp; /* a and as, or the fp8 loop's rows (fp8.c) */
    q.a = (uint8_t *)*at;
    q.as = (int8_t *)(*at + rows * q.Kp);
    q.s = (float *)(void *)(*at + area);
    q.asum = (int32_t *)(void *)(*at + area + 4 * rows * q.nb);
    q.xsum = (float *)(void *)(*at + area + 12 * rows * q.nb);
    *at += ((area + 20 * rows * q.nb) + 63) / 64 * 64;
    return q;
}

int64_t qact_bytes(int64_t rows, int64_t K) {
    int64_t nb = (K + 63) / 64;
    return ((QACT_AREA * rows * nb * 64 + 20 * rows * nb) + 63) / 64 * 64;
}

void quantize_row(const qact *q, int64_t row, const float *x, int64_t K) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    for (int64_t b = 0; b < q->nb; b++) { /* the loop below, 16 columns per register */
        int64_t k0 = b * 64, n = K - k0 < 64 ? K - k0 : 64;
        __m512 v[4];
        __m512 mx = _mm512_setzero_ps();
        for (int i = 0; i < 4; i++) {
            int64_t left = n - 16 * i;
            __mmask16 km = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
            v[i] = _mm512_maskz_loadu_ps(km, x + k0 + 16 * i);
            mx = _mm512_max_ps(mx, _mm512_abs_ps(v[i]));
        }
        float m = _mm512_reduce_max_ps(mx);
        __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
        uint8_t *a = q->a + row * q->Kp + k0;
        int8_t *as = q->as + row * q->Kp + k0;
        for (int h = 0; h < 2; h++) {
            __m512i s32 = _mm512_setzero_si512();
            __m512 xs = _mm512_setzero_ps();
            for (int i = 2 * h; i < 2 * h + 2; i++) {
                __m512i vi = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inv)); /* nearest, ties even */
                vi = _mm512_max_epi32(_mm512_min_epi32(vi, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
                __m128i b8 = _mm512_cvtepi32_epi8(vi);
                _mm_storeu_si128((__m128i *)(void *)(as + 16 * i), b8);
                _mm_storeu_si128((__m128i *)(void *)(a + 16 * i), _mm_xor_si128(b8, _mm_set1_epi8((char)0x80)));
                s32 = _mm512_add_epi32(s32, vi);
                xs = _mm512_add_ps(xs, v[i]);
            }
            q->asum[row * 2 * q->nb + 2 * b + h] = _mm512_reduce_add_epi32(s32);
            q->xsum[row * 2 * q->nb + 2 * b + h] = _mm512_reduce_add_ps(xs);
        }
        q->s[row * q->nb + b] = m / 127.0f;
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undoes the packs' lane interleave */
    for (int64_t b = 0; b < q->nb; b++) { /* the loop below, 8 columns per register */
        int64_t k0 = b * 64, n = K - k0 < 64 ? K - k0 : 64;
        float tail[64];
        const float *src = x + k0;
        if (n < 64) { /* the last block of a K that is not a multiple of 64: zero-padded */
            memset(tail, 0, sizeof tail);
            memcpy(tail, src, (size_t)n * sizeof(float));
            src = tail;
        }
        __m256 v[8];
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < 8; i++) {
            v[i] = _mm256_loadu_ps(src + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float m = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
        uint8_t *a = q->a + row * q->Kp + k0;
        int8_t *as = q->as + row * q->Kp + k0;
        for (int h = 0; h < 2; h++) {
            __m256i vi[4];
            __m256 xs = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                vi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[4 * h + i], inv)); /* nearest, ties even */
                vi[i] = _mm256_max_epi32(_mm256_min_epi32(vi[i], hi), lo);
                xs = _mm256_add_ps(xs, v[4 * h + i]);
            }
            __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(vi[0], vi[1]), _mm256_add_epi32(vi[2], vi[3]));
            __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(vi[0], vi[1]), _mm256_packs_epi32(vi[2], vi[3]));
            b8 = _mm256_permutevar8x32_epi32(b8, order);
            _mm256_storeu_si256((__m256i *)(void *)(as + 32 * h), b8);
            _mm256_storeu_si256((__m256i *)(void *)(a + 32 * h), _mm256_xor_si256(b8, _mm256_set1_epi8((char)0x80)));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            q->asum[row * 2 * q->nb + 2 * b + h] = _mm_cvtsi128_si32(s4);
            q->xsum[row * 2 * q->nb + 2 * b + h] = hsum8(xs);
        }
        q->s[row * q->nb + b] = m / 127.0f;
    }
#else
    for (int64_t b = 0; b < q->nb; b++) {
        int64_t k0 = b * 64, n = K - k0 < 64 ? K - k0 : 64;
        float mx = 0.0f;
        for (int64_t i = 0; i < n; i++) mx = fmaxf(mx, fabsf(x[k0 + i]));
        float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
        uint8_t *a = q->a + row * q->Kp + k0;
        int8_t *as = q->as + row * q->Kp + k0;
        for (int h = 0; h < 2; h++) {
            int32_t sum = 0;
            float xs = 0.0f;
            for (int64_t i = 32 * h; i < 32 * h + 32; i++) {
                int v = i < n ? (int)nearbyintf(x[k0 + i] * inv) : 0;
                v = v > 127 ? 127 : (v < -127 ? -127 : v);
                a[i] = (uint8_t)(v + 128);
                as[i] = (int8_t)v;
                sum += v;
                xs += i < n ? x[k0 + i] : 0.0f;
            }
            q->asum[row * 2 * q->nb + 2 * b + h] = sum;
            q->xsum[row * 2 * q->nb + 2 * b + h] = xs;
        }
        q->s[row * q->nb + b] = mx / 127.0f;
    }
#endif
}
#if INFERSIGHT_VNNI
/* out[r][0..15] = x_r . w[n0 + c] for r < MR: `wb` one packed block of nb groups, `s` its 16 scales. */
static inline __attribute__((always_inline)) void p8_tile(
        const qact *q, int64_t r0, const int8_t *wb, const float *s, const int MR, float *out) {
    __m512 acc[4];
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < q->nb; g++) {
        const int8_t *wg = wb + g * P8_GROUP;
        __m512i ia[4], ib[4];
        for (int r = 0; r < MR; r++) ia[r] = ib[r] = _mm512_setzero_si512();
        for (int t = 0; t < 16; t += 2) {
            __m512i w0 = _mm512_load_si512((const void *)(wg + t * 64));
            __m512i w1 = _mm512_load_si512((const void *)(wg + t * 64 + 64));
            for (int r = 0; r < MR; r++) {
                const uint8_t *a = q->a + (r0 + r) * q->Kp + g * 64 + t * 4;
                ia[r] = _mm512_dpbusd_epi32(ia[r], _mm512_set1_epi32(load4(a)), w0);
                ib[r] = _mm512_dpbusd_epi32(ib[r], _mm512_set1_epi32(load4(a + 4)), w1);
            }
        }
        /* the activations were a + 128: take 128 * the column sums back off */
        __m512i corr = _mm512_slli_epi32(_mm512_load_si512((const void *)(wg + 1024)), 7);
        for (int r = 0; r < MR; r++) {
            __m512i d = _mm512_sub_epi32(_mm512_add_epi32(ia[r], ib[r]), corr);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(q->s[(r0 + r) * q->nb + g]), acc[r]);
        }
    }
    __m512 sv = _mm512_loadu_ps(s);
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(out + r * 16, _mm512_mul_ps(acc[r], sv));
}
#elif INFERSIGHT_I8
/* AVX2, the same product: 32 bytes (8 columns x 4 k) per register, the signed activations
   (`as`) against the signed weights through vpmaddubsw's sign trick (|w| times a with w's
   sign; at most 2 * 128 * 127 per pair, below int16 saturation), summed to int32 by vpmaddwd. */
static inline __attribute__((always_inline)) void p8_tile(
        const qact *q, int64_t r0, const int8_t *wb, const float *s, const int MR, float *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 lo[2], hi[2];
    for (int r = 0; r < MR; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < q->nb; g++) {
        const int8_t *wg = wb + g * P8_GROUP;
        __m256i il[2], ih[2];
        for (int r = 0; r < MR; r++) il[r] = ih[r] = _mm256_setzero_si256();
        for (int t = 0; t < 16; t++) {
            __m256i wl = _mm256_load_si256((const __m256i *)(const void *)(wg + t * 64));
            __m256i wh = _mm256_load_si256((const __m256i *)(const void *)(wg + t * 64 + 32));
            __m256i ul = _mm256_abs_epi8(wl), uh = _mm256_abs_epi8(wh);
            for (int r = 0; r < MR; r++) {
                __m256i a = _mm256_set1_epi32(load4(q->as + (r0 + r) * q->Kp + g * 64 + t * 4));
                il[r] = _mm256_add_epi32(il[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ul, _mm256_sign_epi8(a, wl)), ones));
                ih[r] = _mm256_add_epi32(ih[r], _mm256_madd_epi16(_mm256_maddubs_epi16(uh, _mm256_sign_epi8(a, wh)), ones));
            }
        }
        for (int r = 0; r < MR; r++) {
            __m256 sc = _mm256_set1_ps(q->s[(r0 + r) * q->nb + g]);
            lo[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(il[r]), sc, lo[r]);
            hi[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ih[r]), sc, hi[r]);
        }
    }
    __m256 sl = _mm256_loadu_ps(s), sh = _mm256_loadu_ps(s + 8);
    for (int r = 0; r < MR; r++) {
        _mm256_storeu_ps(out + r * 16, _mm256_mul_ps(lo[r], sl));
        _mm256_storeu_ps(out + r * 16 + 8, _mm256_mul_ps(hi[r], sh));
    }
}
#endif

#if INFERSIGHT_I8
/* out [M][16]: packed block `wb` (scales `s`) for rows r0..r0+M-1 of the quantised activations */
void p8_block(const qact *q, int64_t r0, int64_t M, const int8_t *wb, const float *s, float *out) {
    I8_PASSES(p8_tile, wb, s)
}
#endif

int infersight_has_vnni(void) { return INFERSIGHT_VNNI; }

int infersight_has_int8_dot(void) { return INFERSIGHT_I8; }
