/* What the library's files share and do not export: the ISA switches, the bf16 and int8
   helpers, the quantised activations (`qact`) and the block loops each file provides to the
   decode step. Every loop has an AVX-512, an AVX2/FMA and a plain C body, chosen by the
   compiler's target flags (-march=x86-64-v4 and so on: setup.py builds one library per level). */
#ifndef INFERSIGHT_KERNELS_H
#define INFERSIGHT_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "infersight.h"

#define INFERSIGHT_INTERNAL __attribute__((visibility("hidden")))

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define INFERSIGHT_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define INFERSIGHT_VNNI 0
#define INFERSIGHT_I8_AVX2 1
#else
#define INFERSIGHT_VNNI 0
#endif
/* INFERSIGHT_BF16: fp8 weights are read as bf16 and multiplied against bf16 activations
   (AVX512-BF16's vdpbf16ps): the x86-64-v4-bf16 build */
#if INFERSIGHT_VNNI && defined(__AVX512BF16__)
#define INFERSIGHT_BF16 1
#else
#define INFERSIGHT_BF16 0
#endif
/* INFERSIGHT_F8P: the fp8 loop over a packed copy of the e4m3 bytes exists (fp8.c): against
   bf16 activations (INFERSIGHT_BF16), or against fp32 ones on the AVX2 build, whose qact rows
   then hold 4 bytes a column (QACT_AREA) */
#if INFERSIGHT_BF16
#define INFERSIGHT_F8P 1
#define QACT_AREA 2
#elif defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define INFERSIGHT_F8P 1
#define QACT_AREA 4
#else
#define INFERSIGHT_F8P 0
#define QACT_AREA 2
#endif
/* INFERSIGHT_I8: the int8-activation loops exist (VNNI, or AVX2's multiply-adds) */
#if INFERSIGHT_VNNI || defined(INFERSIGHT_I8_AVX2)
#define INFERSIGHT_I8 1
#else
#define INFERSIGHT_I8 0
#endif

#if INFERSIGHT_I8
/* The packed int8 layout (native_step.py's `pack_int8`, made once at load): per 16-column
   block, per 64-column group of K, 16 k-quads of [16 columns][4 k] int8 (1024 bytes), then the
   group's 16 column sums of w (int32, 64 bytes). One 64-byte load feeds one dpbusd per row
   against the row's 4 activations broadcast; a block is one sequential run of memory, which the
   hardware prefetcher follows (software prefetching here measured slower). */
#define P8_GROUP 1088
#if INFERSIGHT_VNNI
#define I8_ROWS 4 /* activation rows per pass of the int8 and int4 tiles */
#else
#define I8_ROWS 2
#endif
#endif

static inline float bf16_in(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float f16_in(uint16_t h) { /* IEEE half -> float, exactly */
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu, u;
    float f;
    if (e == 0) { /* zero or subnormal: m * 2^-24 */
        f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    u = sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13);
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The e4m3 value of byte b (sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0:
   subnormal, m * 2^-9): the definition every vector decode is tested against. */
static inline float fp8_in(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    float v = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9);
    return b & 0x80 ? -v : v;
}

static inline int32_t load4(const void *p) { /* 4 activation bytes, to broadcast */
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t bf16_out(float f) { /* round to nearest even, as torch's conversion */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

/* int8 activations: a matrix [M, K] as per-64-column blocks of a = round(x / s), s = max|x| / 127,
   stored as a + 128 (u8, dpbusd's unsigned side) and as a (s8, for int4's unsigned nibbles),
   rows Kp = 64 * nb apart and zero-padded (a = 0); per block the scale, and per 32 columns the
   sum of a and the fp32 sum of x (the zero-point terms of int8's offset and int4's groups). */
typedef struct { uint8_t *a; int8_t *as; float *s; int32_t *asum; float *xsum; int64_t Kp, nb; } qact;

/* linear.c: out [m][16] = x [m, K] (rows ldx apart) against one packed fp32 block wb [K][16] */
INFERSIGHT_INTERNAL void tiles(const float *x, int64_t ldx, int64_t m, const float *wb, int64_t K, float *out);

/* int8.c */
/* out [M][16]: rows n0..n0+nr-1 (nr <= 16) of an int8 weight [N, K] with scales [N], for M rows of x */
INFERSIGHT_INTERNAL void rows8(const float *x, int64_t ldx, int64_t M, const int8_t *w, const float *s,
                               int64_t n0, int64_t nr, int64_t K, float *out);
/* the same for float8 e4m3 weight bytes [N, K] (fp8 weight-only models) */
INFERSIGHT_INTERNAL void rowsf8(const float *x, int64_t ldx, int64_t M, const uint8_t *w, const float *s,
                                int64_t n0, int64_t nr, int64_t K, float *out);
#if INFERSIGHT_F8P
/* fp8.c, the packed fp8 loop: `f8_row` writes row `row` of q's byte area as that loop reads it
   (bf16, or fp32 on the AVX2 build; zero past K); `f8_block`: out [M][16] = rows n0..n0+nr-1 of
   an e4m3 weight with scales [N] for rows r0..r0+M-1 of q, `wb` that 16-row block of the packed
   layout (native_step.py `pack_fp8`: per quad of rows, per 64 columns, 4 x 64 bytes) */
INFERSIGHT_INTERNAL void f8_row(const qact *q, int64_t row, const float *x, int64_t K);
INFERSIGHT_INTERNAL void f8_block(const qact *q, int64_t r0, int64_t M, const uint8_t *wb, const float *s,
                                  int64_t n0, int64_t nr, float *out);
#endif
/* a qact of `rows` rows over K carved from *at (64-byte aligned), *at moved past it; its size */
INFERSIGHT_INTERNAL qact qact_at(char **at, int64_t rows, int64_t K);
INFERSIGHT_INTERNAL int64_t qact_bytes(int64_t rows, int64_t K);
/* row `row` of q = x [K] quantised */
INFERSIGHT_INTERNAL void quantize_row(const qact *q, int64_t row, const float *x, int64_t K);

#if INFERSIGHT_I8
/* int8.c: out [M][16]: packed int8 block `wb` (scales `s`) for rows r0..r0+M-1 of q */
INFERSIGHT_INTERNAL void p8_block(const qact *q, int64_t r0, int64_t M, const int8_t *wb, const float *s,
                                  float *out);

/* int4.c: G for a reduction size K: the model's `int4_group` (64, as quant.py's int4_group_size
   chooses, or 32 for a build made with groups of 32) where K is a multiple of 64, else 32 */
static inline int64_t g4(int64_t K, int64_t group) { return K % 64 == 0 && group != 32 ? 64 : 32; }

/* bytes of one packed int4 block of 16 columns over K */
static inline int64_t p4_block_bytes(int64_t K, int64_t group) { return (K / g4(K, group)) * (g4(K, group) * 8 + 64); }

/* int4.c: out [M][16]: packed int4 block `wb` over K (groups of G) for rows r0..r0+M-1 of q */
INFERSIGHT_INTERNAL void p4_block(const qact *q, int64_t r0, int64_t M, const uint8_t *wb, int64_t K,
                                  int64_t G, float *out);

#if I8_ROWS == 4
#define I8_MIDDLE_ROWS(TILE, ...)                            \
    case 2: TILE(q, r0 + r, __VA_ARGS__, 2, o); break;       \
    case 3: TILE(q, r0 + r, __VA_ARGS__, 3, o); break;
#else
#define I8_MIDDLE_ROWS(TILE, ...)
#endif
/* The body of p8_block and p4_block: out [M][16] for rows r0..r0+M-1 of the quantised
   activations `q`, in passes of I8_ROWS rows, each one TILE(q, row, ARGS, rows, out) call
   with `rows` a constant (so the tile's loops over rows unroll). */
#define I8_PASSES(TILE, ...)                                         \
    for (int64_t r = 0; r < M; r += I8_ROWS) {                       \
        int64_t n = M - r < I8_ROWS ? M - r : I8_ROWS;               \
        float *o = out + r * 16;                                     \
        switch (n) {                                                 \
            case 1: TILE(q, r0 + r, __VA_ARGS__, 1, o); break;       \
            I8_MIDDLE_ROWS(TILE, __VA_ARGS__)                        \
            default: TILE(q, r0 + r, __VA_ARGS__, I8_ROWS, o); break; \
        }                                                            \
    }
#endif

#endif
