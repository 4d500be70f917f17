/* The fp32 product over packed weights: `infersight_linear_f32` (any rows, the residual and a
   scale fused in) and `tiles`, the same 16-column block loop the decode step calls. W is packed
   [ceil(N/16)][K][16] (native.py's `pack`): one 16-column block is one contiguous run of
   K * 64 bytes, read once for up to 8 rows at a time, one FMA per row for each 64-byte load. */
#include "kernels.h"

/* Rows m0..m0+MR-1 of out against one 16-column block of the packed weight wb [K][16]:
   acc[i] += x[m0 + i, k] * wb[k][:], one 64-byte weight load feeds MR FMAs. */
static inline __attribute__((always_inline)) void rows(
        const float *x, const float *wb, const float *residual, float *out,
        int64_t m0, const int MR, int64_t n0, int nr, int64_t N, int64_t K, float alpha) {
#ifdef __AVX512F__
    __m512 acc[8];
    for (int i = 0; i < MR; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 wv = _mm512_load_ps(wb + k * 16);
        for (int i = 0; i < MR; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(x[(m0 + i) * K + k]), wv, acc[i]);
    }
    __mmask16 cols = (__mmask16)((1u << nr) - 1u);
    __m512 a = _mm512_set1_ps(alpha);
    for (int i = 0; i < MR; i++) {
        int64_t at = (m0 + i) * N + n0;
        __m512 y = _mm512_mul_ps(acc[i], a);
        if (residual) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(cols, residual + at));
        _mm512_mask_storeu_ps(out + at, cols, y);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (int i0 = 0; i0 < MR; i0 += 4) { /* four rows per pass: 8 sums, 2 weights in ymm */
        __m256 lo[4], hi[4];
        for (int i = 0; i < 4; i++) lo[i] = hi[i] = _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k++) {
            __m256 wl = _mm256_load_ps(wb + k * 16), wh = _mm256_load_ps(wb + k * 16 + 8);
            for (int i = 0; i < 4 && i0 + i < MR; i++) {
                __m256 xv = _mm256_set1_ps(x[(m0 + i0 + i) * K + k]);
                lo[i] = _mm256_fmadd_ps(xv, wl, lo[i]);
                hi[i] = _mm256_fmadd_ps(xv, wh, hi[i]);
            }
        }
        for (int i = 0; i < 4 && i0 + i < MR; i++) {
            float acc[16];
            _mm256_storeu_ps(acc, lo[i]);
            _mm256_storeu_ps(acc + 8, hi[i]);
            int64_t at = (m0 + i0 + i) * N + n0;
            for (int j = 0; j < nr; j++) out[at + j] = (residual ? residual[at + j] : 0.0f) + alpha * acc[j];
        }
    }
#else
    float acc[8][16] = {{0}};
    for (int64_t k = 0; k < K; k++)
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < 16; j++) acc[i][j] += x[(m0 + i) * K + k] * wb[k * 16 + j];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < nr; j++) {
            int64_t at = (m0 + i) * N + n0 + j;
            out[at] = (residual ? residual[at] : 0.0f) + alpha * acc[i][j];
        }
#endif
}

/* out [M, N] = residual [M, N] (or 0) + alpha * x [M, K] @ W^T, W packed as [ceil(N/16)][K][16]
   (zero-padded, 64-byte aligned); contiguous fp32. Parallel over 16-column blocks: each block
   (K * 64 bytes) is read from memory once and stays in cache for every row of x. */
void infersight_linear_f32(const float *x, const float *wp, const float *residual, float *out,
                           int64_t M, int64_t N, int64_t K, float alpha) {
    int64_t blocks = (N + 15) / 16;
    int parallel = N * K >= (1 << 16);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t b = 0; b < blocks; b++) {
        const float *wb = wp + b * K * 16;
        int64_t n0 = b * 16;
        int nr = N - n0 < 16 ? (int)(N - n0) : 16;
        int64_t m0 = 0;
        for (; m0 + 8 <= M; m0 += 8) rows(x, wb, residual, out, m0, 8, n0, nr, N, K, alpha);
        switch (M - m0) {
            case 1: rows(x, wb, residual, out, m0, 1, n0, nr, N, K, alpha); break;
            case 2: rows(x, wb, residual, out, m0, 2, n0, nr, N, K, alpha); break;
            case 3: rows(x, wb, residual, out, m0, 3, n0, nr, N, K, alpha); break;
            case 4: rows(x, wb, residual, out, m0, 4, n0, nr, N, K, alpha); break;
            case 5: rows(x, wb, residual, out, m0, 5, n0, nr, N, K, alpha); break;
            case 6: rows(x, wb, residual, out, m0, 6, n0, nr, N, K, alpha); break;
            case 7: rows(x, wb, residual, out, m0, 7, n0, nr, N, K, alpha); break;
            default: break;
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* AVX2: `tile` for MR <= 4, 16 columns as two 8-float halves (2 x MR sums in registers). */
static inline __attribute__((always_inline)) void tile4(
        const float *x, int64_t ldx, const float *wb, int64_t K, const int MR, float *out) {
    if (MR == 1) { /* one row: two k chains hide the FMA latency */
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0;
        int64_t k = 0;
        for (; k + 2 <= K; k += 2) {
            __m256 x0 = _mm256_set1_ps(x[k]), x1 = _mm256_set1_ps(x[k + 1]);
            a0 = _mm256_fmadd_ps(x0, _mm256_load_ps(wb + k * 16), a0);
            b0 = _mm256_fmadd_ps(x0, _mm256_load_ps(wb + k * 16 + 8), b0);
            a1 = _mm256_fmadd_ps(x1, _mm256_load_ps(wb + k * 16 + 16), a1);
            b1 = _mm256_fmadd_ps(x1, _mm256_load_ps(wb + k * 16 + 24), b1);
        }
        for (; k < K; k++) {
            __m256 x0 = _mm256_set1_ps(x[k]);
            a0 = _mm256_fmadd_ps(x0, _mm256_load_ps(wb + k * 16), a0);
            b0 = _mm256_fmadd_ps(x0, _mm256_load_ps(wb + k * 16 + 8), b0);
        }
        _mm256_storeu_ps(out, _mm256_add_ps(a0, a1));
        _mm256_storeu_ps(out + 8, _mm256_add_ps(b0, b1));
        return;
    }
    __m256 lo[4], hi[4];
    for (int i = 0; i < MR; i++) lo[i] = hi[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 wl = _mm256_load_ps(wb + k * 16), wh = _mm256_load_ps(wb + k * 16 + 8);
        for (int i = 0; i < MR; i++) {
            __m256 xv = _mm256_set1_ps(x[i * ldx + k]);
            lo[i] = _mm256_fmadd_ps(xv, wl, lo[i]);
            hi[i] = _mm256_fmadd_ps(xv, wh, hi[i]);
        }
    }
    for (int i = 0; i < MR; i++) {
        _mm256_storeu_ps(out + i * 16, lo[i]);
        _mm256_storeu_ps(out + i * 16 + 8, hi[i]);
    }
}
#endif

/* out[r][0..15] = x[r, :] . wb[:, 0..15] for r < MR (x rows ldx apart), wb one packed block [K][16]. */
static inline __attribute__((always_inline)) void tile(
        const float *x, int64_t ldx, const float *wb, int64_t K, const int MR, float *out) {
#ifdef __AVX512F__
    if (MR == 1) { /* one row: four chains hide the FMA latency */
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k + 4 <= K; k += 4) {
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), _mm512_load_ps(wb + k * 16), a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(x[k + 1]), _mm512_load_ps(wb + k * 16 + 16), a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(x[k + 2]), _mm512_load_ps(wb + k * 16 + 32), a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(x[k + 3]), _mm512_load_ps(wb + k * 16 + 48), a3);
        }
        for (; k < K; k++) a0 = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), _mm512_load_ps(wb + k * 16), a0);
        _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
        return;
    }
    if (MR == 2) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
        const float *y = x + ldx;
        int64_t k = 0;
        for (; k + 2 <= K; k += 2) {
            __m512 w0 = _mm512_load_ps(wb + k * 16), w1 = _mm512_load_ps(wb + k * 16 + 16);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), w0, a0);
            b0 = _mm512_fmadd_ps(_mm512_set1_ps(y[k]), w0, b0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(x[k + 1]), w1, a1);
            b1 = _mm512_fmadd_ps(_mm512_set1_ps(y[k + 1]), w1, b1);
        }
        for (; k < K; k++) {
            __m512 w0 = _mm512_load_ps(wb + k * 16);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), w0, a0);
            b0 = _mm512_fmadd_ps(_mm512_set1_ps(y[k]), w0, b0);
        }
        _mm512_storeu_ps(out, _mm512_add_ps(a0, a1));
        _mm512_storeu_ps(out + 16, _mm512_add_ps(b0, b1));
        return;
    }
    __m512 acc[8];
    for (int i = 0; i < MR; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 wv = _mm512_load_ps(wb + k * 16);
        for (int i = 0; i < MR; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + k]), wv, acc[i]);
    }
    for (int i = 0; i < MR; i++) _mm512_storeu_ps(out + i * 16, acc[i]);
#elif defined(__AVX2__) && defined(__FMA__)
    if (MR <= 4) tile4(x, ldx, wb, K, MR, out);
    else {
        tile4(x, ldx, wb, K, 4, out);
        tile4(x + 4 * ldx, ldx, wb, K, MR - 4, out + 64);
    }
#else
    float acc[8][16] = {{0}};
    for (int64_t k = 0; k < K; k++)
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < 16; j++) acc[i][j] += x[i * ldx + k] * wb[k * 16 + j];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 16; j++) out[i * 16 + j] = acc[i][j];
#endif
}

/* tile for any rows m (<= 8 per call, chunked here): out [m][16] */
void tiles(const float *x, int64_t ldx, int64_t m, const float *wb, int64_t K, float *out) {
    for (int64_t r = 0; r < m; r += 8) {
        int64_t n = m - r < 8 ? m - r : 8;
        const float *xr = x + r * ldx;
        float *o = out + r * 16;
        switch (n) {
            case 1: tile(xr, ldx, wb, K, 1, o); break;
            case 2: tile(xr, ldx, wb, K, 2, o); break;
            case 3: tile(xr, ldx, wb, K, 3, o); break;
            case 4: tile(xr, ldx, wb, K, 4, o); break;
            case 5: tile(xr, ldx, wb, K, 5, o); break;
            case 6: tile(xr, ldx, wb, K, 6, o); break;
            case 7: tile(xr, ldx, wb, K, 7, o); break;
            default: tile(xr, ldx, wb, K, 8, o); break;
        }
    }
}
