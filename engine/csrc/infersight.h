/* The native library's entry points: what engine/native.py and engine/native_step.py call
   through ctypes (their argtypes mirror these prototypes; README.md says what each computes).
   Only these symbols are exported: the loops behind them are hidden (kernels.h). */
#ifndef INFERSIGHT_H
#define INFERSIGHT_H

#include <stdint.h>

#define INFERSIGHT_API __attribute__((visibility("default")))

/* One Mixtral network as the decode step reads it: the sizes, then pointers to the model's own
   tensors (or to arrays of them, one per layer or per layer and expert). native_step.py's
   `StepModel` is this struct field for field. */
typedef struct {
    int64_t D, H, Hkv, hd, I, E, topk, V, layers, window; /* window 0: none */
    float eps, scale;
    const float *embed;                 /* [V, D] */
    const float *const *attn_norm;      /* [layers] -> [D] */
    const float *const *wqkv;           /* [layers] -> packed [(H + 2 Hkv) hd] x D */
    const float *const *wo;             /* [layers] -> packed D x H hd */
    const float *const *ffn_norm;       /* [layers] -> [D] */
    const float *const *gate;           /* [layers] -> packed E x D (the router) */
    const float *const *w13;            /* [layers * E] -> packed 2I x D (w1 rows, then w3) */
    const float *const *w2;             /* [layers * E] -> packed D x I */
    const float *norm;                  /* [D] */
    const float *head;                  /* packed V x D */
    /* quantized 1 (int8 weight-only models): the projections' pointers above are int8 [N, K]
       row-major, with per-row scales here; 2 (int4, builds with int8-activation loops only):
       they and the `_p` ones below are int4.c's packed blocks, scales inside; 3 (fp8 weight-only):
       as 1 with float8 e4m3 bytes, never int8 activations (with `fp8_packed`, the `_p` ones are
       the bytes packed for fp8.c's `f8_block`). All: embedding and KV cache bf16;
       norms, router, RoPE fp32 */
    int64_t quantized;
    const float *const *wqkv_s, *const *wo_s, *const *w13_s, *const *w2_s;
    const float *head_s;
    int64_t act8; /* quantized: int8 activations too (builds with int8-activation loops; else ignored) */
    /* act8: the projections packed (int8.c's layout; w13 as w1's blocks, then w3's)
       and their scales padded to whole 16-column blocks */
    const int8_t *const *wqkv_p, *const *wo_p, *const *w13_p, *const *w2_p;
    const int8_t *head_p;
    const float *const *wqkv_ps, *const *wo_ps, *const *w13_ps, *const *w2_ps;
    const float *head_ps;
    /* the head's own kind where it differs from `quantized`: 1, int8 rows: an int4 model's (its
       `head_p`/`head_ps` packed as int8's, read with the int8 activations) or an fp8 model's
       (`head`/`head_s` read by rows8 against the fp32 activations); 0: as the model */
    int64_t head_quantized;
    /* int4: the group size of the projections whose K is a multiple of 64: 64 (0 means 64 too),
       or 32 for a build made with groups of 32 (a llama.cpp q4_0/q4_1 import); other K: 32 */
    int64_t int4_group;
    /* fp8, builds with the packed fp8 loop (AVX2, AVX512-BF16): 1 when no weight byte is a
       subnormal e4m3 code (the quantizer writes none) and the `_p` copies are made; 0: the
       row-major loop */
    int64_t fp8_packed;
} infersight_model;

/* linear.c: out [M, N] = residual [M, N] (or 0) + alpha * x [M, K] @ W^T, W packed [N/16][K][16] */
INFERSIGHT_API void infersight_linear_f32(const float *x, const float *wp, const float *residual, float *out,
                                          int64_t M, int64_t N, int64_t K, float alpha);

/* fp8.c: out [M, N] = x [M, K] @ (s [N] * W)^T for float8 e4m3 bytes W [N, K] row-major: the
   fp8 weight-only product on its own, serial (the decode step's loop: with x rounded to bf16
   where the build has AVX512-BF16 and W has no subnormal codes; tests hold it to torch) */
INFERSIGHT_API void infersight_rows_fp8(const float *x, const uint8_t *w, const float *s, float *out,
                                        int64_t M, int64_t N, int64_t K);

/* decode_step.c: one decode step of B rows -> -1, or the first bad row (token b, slot B + b,
   position 2B + b), nothing written then; and the scratch it needs, in floats */
INFERSIGHT_API int64_t infersight_decode_step(const infersight_model *m, int64_t B, const int64_t *tokens,
                                              const int64_t *slots, const int64_t *positions,
                                              void *kcache, void *vcache, int64_t max_batch, int64_t S,
                                              const float *rope_cos, const float *rope_sin,
                                              float *logits, float *scratch, int64_t threads, int64_t last_only);
INFERSIGHT_API int64_t infersight_step_scratch(const infersight_model *m, int64_t B, int64_t threads);

/* which loops the build took (the compiler's target flags decide: -march=...) */
INFERSIGHT_API int infersight_has_avx512(void);   /* decode_step.c */
INFERSIGHT_API int infersight_has_vnni(void);     /* int8.c */
INFERSIGHT_API int infersight_has_int8_dot(void); /* int8.c: int8-activation loops (VNNI or AVX2) */
INFERSIGHT_API int infersight_has_bf16(void);     /* fp8.c: fp8 against bf16 activations (AVX512-BF16) */
INFERSIGHT_API int infersight_has_fp8_packed(void); /* fp8.c: the packed fp8 loop (AVX2 or AVX512-BF16) */

#endif
