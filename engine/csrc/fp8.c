/* The fp8 weight-only loop over a packed copy of the e4m3 bytes (native_step.py `pack_fp8`:
   per quad of 4 rows, per 64 columns, the 4 rows' 64 bytes, so a 16-row block is one stream,
   which the hardware prefetcher follows; the row-major bytes that int8.c's `rowsf8` reads cost
   it much of its speed on some CPUs). No table and no conversion instruction: a normal e4m3
   byte c is, bit for bit, the bf16 (sign-extended c << 4) & 0x87f0, 2^-120 times its value
   (its sign at bit 15, its 4 exponent bits at the bottom of bf16's 8, its 3 mantissa bits at
   the top of bf16's 7; 0 stays 0). The AVX512-BF16 build multiplies those bf16 weights against
   the activations rounded to bf16 (`vdpbf16ps`); the AVX2 build widens them to fp32 and keeps
   the activations in fp32. Both take the loop only for weights without subnormal codes (the
   quantizer writes none), and each lays the activation rows out once per product in the order
   its decode produces the weights (`f8_row`). */
#include <stdlib.h>

#include "kernels.h"

#define F8_X_UP 18446744073709551616.0f /* 2^64: on the activations */
#define F8_OUT 72057594037927936.0f     /* 2^56: with the scale */

#if INFERSIGHT_BF16
/* fp8 against bf16 activations. One 64-byte load gives 32 bf16 weights from the high bytes of
   its words (an arithmetic shift right by 4) and 32 from the low bytes (shifted up by 8 first):
   three shifts and two ands per 64 weights, and the even/odd order is undone on the
   activations' side (`f8_row`). The 2^-120 is taken back in two halves: 2^64 on the
   activations (which keeps every product a normal number: vdpbf16ps flushes subnormals) and
   2^56 with the scale. Subnormal e4m3 codes would read as bf16 subnormals, i.e. as 0. */
/* out[r * 16 + c] = s[c] * x_r . w[c] for r < MR, c < nc: one quad of the packed e4m3 layout
   (`wq`: per 64 columns of K, the quad's 4 rows' 64 bytes, 256 bytes a chunk, one stream)
   against the rows of `f8_row` (Kp words apart). Rows and columns past the weight's are
   zero bytes, the value 0. */
typedef uint16_t f8x; /* an activation as f8_row lays it out */

static inline __attribute__((always_inline)) void quadf8(
        const f8x *xb, int64_t Kp, const uint8_t *wq, const float *s, int64_t nc, const int MR,
        float *out) {
    const __m512i keep = _mm512_set1_epi16((short)0x87f0);
    /* up to two rows, the odd columns' products go to sums of their own: twice the independent
       chains of vdpbf16ps, whose latency is what a one-row decode waits on */
    __m512 acc[4][4], odd_acc[2][4];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    for (int r = 0; r < MR && MR <= 2; r++)
        for (int c = 0; c < 4; c++) odd_acc[r][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < Kp; k += 64) {
        const uint8_t *chunk = wq + 4 * k;
        __m512i even[4], odd[4];
        for (int c = 0; c < 4; c++) {
            _mm_prefetch((const char *)(chunk + 1024 + 64 * c), _MM_HINT_T0);
            __m512i b = _mm512_loadu_si512((const void *)(chunk + 64 * c));
            even[c] = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(b, 8), 4), keep);
            odd[c] = _mm512_and_si512(_mm512_srai_epi16(b, 4), keep);
        }
        for (int r = 0; r < MR; r++) {
            __m512bh xe = (__m512bh)_mm512_loadu_si512((const void *)(xb + r * Kp + k));
            __m512bh xo = (__m512bh)_mm512_loadu_si512((const void *)(xb + r * Kp + k + 32));
            for (int c = 0; c < 4; c++) {
                if (MR <= 2) {
                    acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xe, (__m512bh)even[c]);
                    odd_acc[r & 1][c] = _mm512_dpbf16_ps(odd_acc[r & 1][c], xo, (__m512bh)odd[c]);
                } else {
                    acc[r][c] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][c], xe, (__m512bh)even[c]), xo,
                                                 (__m512bh)odd[c]);
                }
            }
        }
    }
    for (int r = 0; r < MR && MR <= 2; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_add_ps(acc[r][c], odd_acc[r][c]);
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < nc; c++) out[r * 16 + c] = s[c] * F8_OUT * _mm512_reduce_add_ps(acc[r][c]);
}

void f8_row(const qact *q, int64_t row, const float *x, int64_t K) {
    uint16_t *dst = (uint16_t *)(void *)q->a + row * q->Kp;
    const __m512 up = _mm512_set1_ps(F8_X_UP);
    /* per 64 columns: the even ones, then the odd ones (the weights' low and high bytes) */
    const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    for (int64_t k = 0; k < q->Kp; k += 32) {
        int64_t left = K - k;
        __mmask16 m0 = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
        __mmask16 m1 = left >= 32 ? (__mmask16)0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1u);
        __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, x + k), up);
        __m512 b = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, x + k + 16), up);
        __m512 e = _mm512_permutex2var_ps(a, evens, b), o = _mm512_permutex2var_ps(a, odds, b);
        /* 16 even columns of these 32 go to the chunk's first half, the odd ones to its second */
        uint16_t *chunk = dst + (k & ~(int64_t)63) + (k & 32) / 2;
        _mm256_storeu_si256((__m256i *)(void *)chunk, (__m256i)_mm512_cvtneps_pbh(e)); /* nearest even */
        _mm256_storeu_si256((__m256i *)(void *)(chunk + 32), (__m256i)_mm512_cvtneps_pbh(o));
    }
}
#elif INFERSIGHT_F8P
/* fp8 against fp32 activations (the AVX2 build). The bf16 pattern above, as the high half of
   a 32-bit word, is an fp32 2^-120 times the e4m3 value, and here subnormal codes too read
   exactly (as fp32 subnormals; the loop is still taken only where there are none, so that a
   process flushing subnormals to zero cannot change a result). Per 32 bytes: words shifted
   left by 8 and both sets shifted right by 4 (arithmetic: the sign lands at bit 15), then each
   dword's four bytes picked out by a shift by 16 and an and: nine operations for 32 weights,
   as 4 registers of 8 (bytes 4d, 4d+1, 4d+2, 4d+3 of the 32). `f8_row` lays each row's 32
   columns out in that order, once per row and product, times 2^64 so that no product of the
   2^-120-scaled weights is subnormal; the other 2^56 comes with the scale. */

/* out[r * 16 + c] = s[c] * x_r . w[c] for r < MR, c < nc: one quad of the packed layout against
   rows of `f8_row` (Kp floats apart), CW of its 4 rows per pass over K (4 for up to two
   activation rows, 2 beyond: the sums and the decoded weights fit the 16 registers). One
   activation row keeps two sums per weight row: the FMA latency is what a one-row decode
   waits on. */
typedef float f8x;

static inline __attribute__((always_inline)) void quadf8(
        const f8x *xp, int64_t Kp, const uint8_t *wq, const float *s, int64_t nc, const int MR,
        float *out) {
    const int CW = MR <= 2 ? 4 : 2, P = MR == 1 ? 2 : 1;
    const __m256i keep = _mm256_set1_epi32((int)0x87f00000u);
    for (int c0 = 0; c0 < 4; c0 += CW) {
        __m256 acc[4][4][2];
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < CW; c++)
                for (int p = 0; p < P; p++) acc[r][c][p] = _mm256_setzero_ps();
        for (int64_t k = 0; k < Kp; k += 64) {
            const uint8_t *chunk = wq + 4 * k;
            for (int c = 0; c < CW; c++) {
                _mm_prefetch((const char *)(chunk + 1024 + 64 * (c0 + c)), _MM_HINT_T0);
                for (int h = 0; h < 2; h++) {
                    __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(chunk + 64 * (c0 + c) + 32 * h));
                    __m256i lo = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 4), hi = _mm256_srai_epi16(b, 4);
                    __m256 w[4] = {
                        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(lo, 16), keep)),
                        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(hi, 16), keep)),
                        _mm256_castsi256_ps(_mm256_and_si256(lo, keep)),
                        _mm256_castsi256_ps(_mm256_and_si256(hi, keep)),
                    };
                    for (int r = 0; r < MR; r++) {
                        const float *xr = xp + r * Kp + k + 32 * h;
                        for (int j = 0; j < 4; j++)
                            acc[r][c][j % P] = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(xr + 8 * j), acc[r][c][j % P]);
                    }
                }
            }
        }
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < CW && c0 + c < nc; c++) {
                __m256 a = P == 2 ? _mm256_add_ps(acc[r][c][0], acc[r][c][P - 1]) : acc[r][c][0];
                out[r * 16 + c0 + c] = s[c0 + c] * F8_OUT * hsum8(a);
            }
    }
}

void f8_row(const qact *q, int64_t row, const float *x, int64_t K) {
    float *dst = (float *)(void *)q->a + row * q->Kp;
    /* per 32 columns: every fourth from the first, from the second, the third, the fourth */
    for (int64_t k = 0; k < q->Kp; k += 32)
        for (int j = 0; j < 4; j++)
            for (int d = 0; d < 8; d++) {
                int64_t col = k + 4 * d + j;
                dst[k + 8 * j + d] = col < K ? x[col] * F8_X_UP : 0.0f;
            }
}
#endif

#if INFERSIGHT_F8P
/* The M activation rows of `f8_row` (from row r0) against one block of nr <= 16 weight rows,
   a quad of rows at a time: out[r * 16 + c]. */
void f8_block(const qact *q, int64_t r0, int64_t M, const uint8_t *wb, const float *s, int64_t n0, int64_t nr,
              float *out) {
    const f8x *xa = (const f8x *)(const void *)q->a + r0 * q->Kp;
    for (int64_t r = 0; r < M; r += 4) {
        int64_t n = M - r < 4 ? M - r : 4;
        for (int64_t c = 0; c < nr; c += 4) {
            const uint8_t *wq = wb + c * q->Kp; /* the block's quads, 4 * Kp bytes each */
            const float *sc = s + n0 + c;
            const f8x *xr = xa + r * q->Kp;
            int64_t nc = nr - c < 4 ? nr - c : 4;
            float *o = out + r * 16 + c;
            switch (n) {
                case 1: quadf8(xr, q->Kp, wq, sc, nc, 1, o); break;
                case 2: quadf8(xr, q->Kp, wq, sc, nc, 2, o); break;
                case 3: quadf8(xr, q->Kp, wq, sc, nc, 3, o); break;
                default: quadf8(xr, q->Kp, wq, sc, nc, 4, o); break;
            }
        }
    }
}
#endif

void infersight_rows_fp8(const float *x, const uint8_t *w, const float *s, float *out, int64_t M, int64_t N,
                         int64_t K) {
    float tmp[4 * 16];
#if INFERSIGHT_F8P /* the decode step's loop over the packed bytes, four rows at a time (weights without subnormals) */
    int subnormal = 0;
    for (int64_t i = 0; i < N * K; i++) subnormal |= (w[i] & 0x78) == 0 && (w[i] & 7) != 0;
    const int64_t Kp = 64 * ((K + 63) / 64);
    float xb[QACT_AREA * Kp] __attribute__((aligned(64))); /* 4 rows of QACT_AREA bytes a column */
    qact q = {(uint8_t *)(void *)xb, 0, 0, 0, 0, Kp, Kp / 64};
    uint8_t *packed = subnormal ? 0 : calloc((size_t)((N + 15) / 16 * 16 * Kp), 1); /* the step's layout */
    if (!subnormal && !packed) subnormal = 1; /* no memory: the fp32 loop, which needs none */
    for (int64_t n = 0; packed && n < N; n++)
        for (int64_t k = 0; k < K; k++)
            packed[(n / 4) * 4 * Kp + (k / 64) * 256 + (n % 4) * 64 + k % 64] = w[n * K + k];
#endif
    for (int64_t r = 0; r < M; r += 4) {
        int64_t m = M - r < 4 ? M - r : 4;
#if INFERSIGHT_F8P
        for (int64_t i = 0; i < m && !subnormal; i++) f8_row(&q, i, x + (r + i) * K, K);
#endif
        for (int64_t n0 = 0; n0 < N; n0 += 16) {
            int64_t nr = N - n0 < 16 ? N - n0 : 16;
#if INFERSIGHT_F8P
            if (!subnormal) f8_block(&q, 0, m, packed + n0 * Kp, s, n0, nr, tmp);
            else
#endif
                rowsf8(x + r * K, K, m, w, s, n0, nr, K, tmp);
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < nr; j++) out[(r + i) * N + n0 + j] = tmp[i * 16 + j];
        }
    }
#if INFERSIGHT_F8P
    free(packed);
#endif
}


int infersight_has_bf16(void) { return INFERSIGHT_BF16; }

int infersight_has_fp8_packed(void) { return INFERSIGHT_F8P; }
