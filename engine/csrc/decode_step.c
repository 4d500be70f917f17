/* The decode step: every layer of one token per row in one OpenMP parallel region (native_step.py
   says what it computes and why; README.md lists the phases). fp32 models read the packed
   weights (linear.c's tiles); int8 weight-only ones the engine's int8 [N, K] rows and per-row
   scales (int8.c's rows8), or with int8 activations a packed copy (p8_block); int4 ones their
   packed blocks against int8 activations (int4.c's p4_block); fp8 weight-only ones a packed copy
   of their e4m3 bytes (fp8.c's f8_block) or, where the build or the bytes do not allow it, their
   [N, K] bytes and per-row scales (int8.c's rowsf8), like int8's rows. */
#include <math.h>
#include <omp.h>

#include "kernels.h"

/* One projection as the step reads it: fp32 packed or int8 rows `w` (scales `s`), and for
   int8 activations the packed int8 copy `p` (scales `ps`). */
typedef struct { const void *w; const float *s; const int8_t *p; const float *ps; } wref;

/* out [M][16] = columns n0..n0+nr-1 (n0 a multiple of 16, nr <= 16; packed block `bi`) of
   x [M, K] @ W^T: W packed fp32, or int8 rows when `quantized`, or with int8 activations `qx`
   (rows r0.. of it) the packed int8 copy; int4 blocks grouped as the model's `int4_group` says. */
static void block(int64_t quantized, const float *x, int64_t ldx, int64_t M, wref W, int64_t n0, int64_t bi,
                  int64_t nr, int64_t K, float *out, const qact *qx, int64_t r0, int64_t group) {
#if INFERSIGHT_F8P
    if (quantized == 3 && qx) { /* fp8 against the rows of qx (fp8.c): block bi of the packed copy */
        f8_block(qx, r0, M, (const uint8_t *)W.p + bi * 16 * qx->Kp, W.s, n0, nr, out);
        return;
    }
#endif
#if INFERSIGHT_I8
    if (quantized == 2) { /* int4: always int8 activations */
        p4_block(qx, r0, M, (const uint8_t *)W.p + bi * p4_block_bytes(K, group), K, g4(K, group), out);
        return;
    }
    if (quantized && qx) {
        p8_block(qx, r0, M, W.p + bi * qx->nb * P8_GROUP, W.ps + bi * 16, out);
        return;
    }
#else
    (void)qx;
    (void)r0;
    (void)bi;
    (void)group;
#endif
    if (quantized == 3) rowsf8(x, ldx, M, (const uint8_t *)W.w, W.s, n0, nr, K, out); /* fp8 */
    else if (quantized) rows8(x, ldx, M, (const int8_t *)W.w, W.s, n0, nr, K, out);
    else tiles(x, ldx, M, (const float *)W.w + (n0 / 16) * K * 16, K, out);
}

/* Inside a parallel region: out [M, N] (+)= x [M, K] @ W^T (see `block`); `add`: accumulate into out.
   Work-shared over 16-column blocks; ends with the loop's barrier. acc: this thread's [M][16]. */
static void linear_for(int64_t quantized, const float *x, int64_t M, wref W, int64_t N, int64_t K,
                       float *out, int add, float *acc, const qact *qx, int64_t group) {
    int64_t blocks = (N + 15) / 16;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * 16, nr = N - n0 < 16 ? N - n0 : 16;
        block(quantized, x, K, M, W, n0, b, nr, K, acc, qx, 0, group);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < nr; j++) {
                float *o = out + i * N + n0 + j;
                *o = add ? *o + acc[i * 16 + j] : acc[i * 16 + j];
            }
    }
}

static inline float dot(const float *a, const float *b, int64_t n) {
#ifdef __AVX512F__
    __m512 s = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), s);
    }
    return _mm512_reduce_add_ps(s);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
    float r = hsum8(s);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
#else
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
#endif
}

static void rms_norm_rows(const float *x, const float *w, float *out, int64_t M, int64_t D, float eps) {
    for (int64_t i = 0; i < M; i++) {
        const float *r = x + i * D;
        float ss = dot(r, r, D);
        float inv = 1.0f / sqrtf(eps + ss / (float)D);
        for (int64_t j = 0; j < D; j++) out[i * D + j] = r[j] * inv * w[j];
    }
}

/* Floats of scratch one step of B rows on `threads` threads needs (the caller keeps one per B). */
INFERSIGHT_API int64_t infersight_step_scratch(const infersight_model *m, int64_t B, int64_t threads) {
    int64_t bk = B * m->topk, NQ = (m->H + 2 * m->Hkv) * m->hd;
    int64_t floats = 2 * B * m->D + B * NQ + B * m->H * m->hd + B * m->E + bk
                     + bk * m->D + bk * 2 * m->I + bk * m->I + threads * (2 * B * 16 + 2 * m->hd);
    int64_t ints = 2 * bk + 3 * m->E + 1;
    int64_t bytes = qact_bytes(B, m->D) + qact_bytes(B, m->H * m->hd) + qact_bytes(bk, m->D) + qact_bytes(bk, m->I);
    return floats + 2 * ints + bytes / 4 + 64;
}

/* projection i of a per-layer (or per-expert) array, with its scales and packed copy where used */
static inline wref ref(const float *const *w, const float *const *s, const int8_t *const *p,
                       const float *const *ps, int64_t i, int64_t q8, int packed) {
    wref r = {w[i], q8 && s ? s[i] : 0, packed && p ? p[i] : 0, packed && ps ? ps[i] : 0};
    return r;
}

static inline float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* row `row` of the activations the step's loops read: int8 (int8 and int4 models), or the packed
   fp8 loop's (fp8 models on builds that have it: bf16 or fp32, fp8.c) */
static inline void act_row(int f8, const qact *q, int64_t row, const float *x, int64_t K) {
#if INFERSIGHT_F8P
    if (f8) {
        f8_row(q, row, x, K);
        return;
    }
#else
    (void)f8;
#endif
    quantize_row(q, row, x, K);
}

/* One decode step: tokens[b] at positions[b] of cache slot slots[b] -> logits [B, V] (with
   `last_only`, [1, V]: row B - 1's), the keys and values written into the cache. One
   parallel region; between its phases only the work-sharing loops' barriers. Rows may share
   a slot at consecutive positions (a prompt: every row's keys and values are written before
   any row attends, so row b sees the rows before it). Returns -1, or the first row whose
   token id is not in [0, V) (then nothing is computed or written). */
int64_t infersight_decode_step(const infersight_model *m, int64_t B, const int64_t *tokens,
                            const int64_t *slots, const int64_t *positions,
                            void *kcache, void *vcache, int64_t max_batch, int64_t S,
                            const float *rope_cos, const float *rope_sin,
                            float *logits, float *scratch, int64_t threads, int64_t last_only) {
    const int64_t D = m->D, H = m->H, Hkv = m->Hkv, hd = m->hd, I = m->I, E = m->E, topk = m->topk;
    const int64_t NQ = (H + 2 * Hkv) * hd, bk = B * topk, heads = H + 2 * Hkv, out_rows = last_only ? 1 : B;
    const int64_t per_kv = max_batch * Hkv * S * hd, stride = 2 * B * 16 + 2 * hd;
    const int64_t q8 = m->quantized, esz = q8 ? 2 : 4, grp = m->int4_group; /* cache element: bf16 or fp32 */
    /* w1 block j and w3 block I/16 + j cover the same columns (int8 rows: any I) */
    const int fused = q8 || I % 16 == 0;
    const int64_t iblocks = (I + 15) / 16, dblocks = (D + 15) / 16;
    float *x = scratch, *xn = x + B * D, *qkv = xn + B * D, *attn = qkv + B * NQ;
    float *router = attn + B * H * hd, *sel_w = router + B * E, *xe = sel_w + bk;
    float *h = xe + bk * D, *act = h + bk * 2 * I, *per_thread = act + bk * I;
    int64_t *sel_e = (int64_t *)(void *)(((uintptr_t)(per_thread + threads * stride) + 15) & ~(uintptr_t)15);
    int64_t *order = sel_e + bk, *group = order + bk, *count = group + E + 1, *active = count + E;
    int64_t n_active = 0;
    const int v8 = q8 && q8 != 3 && (m->act8 || q8 == 2) && INFERSIGHT_I8; /* int4 (q8 == 2): always; fp8: never */
    const int f8p = q8 == 3 && INFERSIGHT_F8P && m->fp8_packed, aq = v8 || f8p; /* aq: the loops read qact rows */
    const int head8 = q8 == 3 && m->head_quantized && m->head_p && INFERSIGHT_I8; /* fp8's int8 head, packed */
    char *qat = (char *)(((uintptr_t)(active + E) + 63) & ~(uintptr_t)63);
    qact qxn = qact_at(&qat, B, D), qattn = qact_at(&qat, B, H * hd);
    qact qxe = qact_at(&qat, bk, D), qa = qact_at(&qat, bk, I);

    /* the first bad row b: b (token id), B + b (slot), 2B + b (position); -1 at the end: done */
    for (int64_t b = 0; b < B; b++) {
        if (tokens[b] < 0 || tokens[b] >= m->V) return b;
        if (slots[b] < 0 || slots[b] >= max_batch) return B + b;
        if (positions[b] < 0 || positions[b] >= S) return 2 * B + b;
    }
    for (int64_t b = 0; b < B; b++) {
        if (q8)
            for (int64_t j = 0; j < D; j++) x[b * D + j] = bf16_in(((const uint16_t *)m->embed)[tokens[b] * D + j]);
        else
            memcpy(x + b * D, m->embed + tokens[b] * D, D * sizeof(float));
    }

#pragma omp parallel num_threads((int)threads)
    {
        int tid = omp_get_thread_num();
        float *acc = per_thread + tid * stride, *acc2 = acc + B * 16, *tmp = acc2 + B * 16, *tmp2 = tmp + hd;
        for (int64_t l = 0; l < m->layers; l++) {
            char *kc = (char *)kcache + l * per_kv * esz, *vc = (char *)vcache + l * per_kv * esz;
#pragma omp single
            {
                rms_norm_rows(x, m->attn_norm[l], xn, B, D, m->eps);
                if (aq)
                    for (int64_t b = 0; b < B; b++) act_row(f8p, &qxn, b, xn + b * D, D);
            }
            linear_for(q8, xn, B, ref(m->wqkv, m->wqkv_s, m->wqkv_p, m->wqkv_ps, l, q8, aq), NQ, D, qkv, 0, acc,
                       aq ? &qxn : 0, grp);
            /* RoPE on the q and k heads; k and v into the cache */
#pragma omp for schedule(static)
            for (int64_t item = 0; item < B * heads; item++) {
                int64_t b = item / heads, head = item % heads, pos = positions[b];
                float *v = qkv + b * NQ + head * hd;
                if (head < H + Hkv) {
                    const float *c = rope_cos + pos * hd, *s = rope_sin + pos * hd;
                    int64_t half = hd / 2;
                    for (int64_t i = 0; i < hd; i++) tmp[i] = v[i];
                    for (int64_t i = 0; i < hd; i++) v[i] = tmp[i] * c[i] + tmp[(i + half) % hd] * s[i];
                }
                if (head >= H) {
                    int64_t g = head < H + Hkv ? head - H : head - H - Hkv;
                    char *dst = (head < H + Hkv ? kc : vc) + ((slots[b] * Hkv + g) * S + pos) * hd * esz;
                    if (q8)
                        for (int64_t i = 0; i < hd; i++) ((uint16_t *)dst)[i] = bf16_out(v[i]);
                    else
                        memcpy(dst, v, hd * sizeof(float));
                }
            }
            /* attention: each (row, query head) over its slot's positions, one pass (running max) */
#pragma omp for schedule(static)
            for (int64_t item = 0; item < B * H; item++) {
                int64_t b = item / H, head = item % H, g = head / (H / Hkv), pos = positions[b];
                const float *q = qkv + b * NQ + head * hd;
                const char *keys = kc + (slots[b] * Hkv + g) * S * hd * esz;
                const char *vals = vc + (slots[b] * Hkv + g) * S * hd * esz;
                float *o = attn + b * H * hd + head * hd, mx = -INFINITY, sum = 0.0f;
                int64_t t0 = m->window > 0 && pos - m->window + 1 > 0 ? pos - m->window + 1 : 0;
                for (int64_t i = 0; i < hd; i++) o[i] = 0.0f;
                for (int64_t t = t0; t <= pos; t++) {
                    const float *k = (const float *)(const void *)(keys + t * hd * esz);
                    const float *vv = (const float *)(const void *)(vals + t * hd * esz);
                    if (q8) {
                        for (int64_t i = 0; i < hd; i++) tmp[i] = bf16_in(((const uint16_t *)k)[i]);
                        for (int64_t i = 0; i < hd; i++) tmp2[i] = bf16_in(((const uint16_t *)vv)[i]);
                        k = tmp;
                        vv = tmp2;
                    }
                    float s = dot(q, k, hd) * m->scale;
                    if (s > mx) {
                        float r = expf(mx - s);
                        sum *= r;
                        for (int64_t i = 0; i < hd; i++) o[i] *= r;
                        mx = s;
                    }
                    float p = expf(s - mx);
                    sum += p;
                    for (int64_t i = 0; i < hd; i++) o[i] += p * vv[i];
                }
                for (int64_t i = 0; i < hd; i++) o[i] /= sum;
            }
            if (aq) {
#pragma omp for schedule(static)
                for (int64_t b = 0; b < B; b++) act_row(f8p, &qattn, b, attn + b * H * hd, H * hd);
            }
            linear_for(q8, attn, B, ref(m->wo, m->wo_s, m->wo_p, m->wo_ps, l, q8, aq), D, H * hd, x, 1, acc,
                       aq ? &qattn : 0, grp); /* x += attention */
#pragma omp single
            rms_norm_rows(x, m->ffn_norm[l], xn, B, D, m->eps);
            linear_for(0, xn, B, (wref){m->gate[l], 0, 0, 0}, E, D, router, 0, acc, 0, 0); /* the router: fp32 always */
            /* routing: each row's top-k logits, softmax over them (== softmax over all experts,
               top-k, renormalised); the (row, k) pairs grouped by expert, their x copied in */
#pragma omp single
            {
                for (int64_t e = 0; e < E; e++) count[e] = 0;
                for (int64_t b = 0; b < B; b++) {
                    const float *r = router + b * E;
                    int64_t *chosen = sel_e + b * topk;
                    float *w = sel_w + b * topk, sum = 0.0f;
                    for (int64_t j = 0; j < topk; j++) {
                        int64_t best = -1;
                        for (int64_t e = 0; e < E; e++) {
                            int taken = 0;
                            for (int64_t u = 0; u < j; u++) taken |= chosen[u] == e;
                            if (!taken && (best < 0 || r[e] > r[best])) best = e;
                        }
                        chosen[j] = best;
                        count[best]++;
                    }
                    for (int64_t j = 0; j < topk; j++) sum += (w[j] = expf(r[chosen[j]] - r[chosen[0]]));
                    for (int64_t j = 0; j < topk; j++) w[j] /= sum;
                }
                n_active = 0;
                group[0] = 0;
                for (int64_t e = 0; e < E; e++) {
                    group[e + 1] = group[e] + count[e];
                    if (count[e]) active[n_active++] = e;
                    count[e] = group[e];
                }
                for (int64_t p = 0; p < bk; p++) {
                    int64_t at = count[sel_e[p]]++;
                    order[at] = p;
                    memcpy(xe + at * D, xn + (p / topk) * D, D * sizeof(float));
                }
                if (aq)
                    for (int64_t r = 0; r < bk; r++) act_row(f8p, &qxe, r, xe + r * D, D);
            }
            /* the chosen experts' w1 and w3 (and SiLU(w1 x) * w3 x when the blocks line up) */
            if (fused) {
#pragma omp for schedule(static)
                for (int64_t item = 0; item < n_active * iblocks; item++) {
                    int64_t e = active[item / iblocks], j = item % iblocks;
                    int64_t g0 = group[e], n = group[e + 1] - g0;
                    wref w = ref(m->w13, m->w13_s, m->w13_p, m->w13_ps, l * E + e, q8, aq);
                    int64_t nr = I - j * 16 < 16 ? I - j * 16 : 16;
                    const qact *qx = aq ? &qxe : 0;
                    block(q8, xe + g0 * D, D, n, w, j * 16, j, nr, D, acc, qx, g0, grp);
                    block(q8, xe + g0 * D, D, n, w, q8 ? I + j * 16 : (iblocks + j) * 16, iblocks + j, nr, D, acc2,
                          qx, g0, grp);
                    for (int64_t i = 0; i < n; i++)
                        for (int64_t c = 0; c < nr; c++)
                            act[(g0 + i) * I + j * 16 + c] = silu_mul(acc[i * 16 + c], acc2[i * 16 + c]);
                }
            } else {
                int64_t hblocks = (2 * I + 15) / 16;
#pragma omp for schedule(static)
                for (int64_t item = 0; item < n_active * hblocks; item++) {
                    int64_t e = active[item / hblocks], j = item % hblocks;
                    int64_t g0 = group[e], n = group[e + 1] - g0, nr = 2 * I - j * 16 < 16 ? 2 * I - j * 16 : 16;
                    tiles(xe + g0 * D, D, n, m->w13[l * E + e] + j * D * 16, D, acc);
                    for (int64_t i = 0; i < n; i++)
                        for (int64_t c = 0; c < nr; c++) h[(g0 + i) * 2 * I + j * 16 + c] = acc[i * 16 + c];
                }
#pragma omp for schedule(static)
                for (int64_t r = 0; r < bk; r++)
                    for (int64_t c = 0; c < I; c++) act[r * I + c] = silu_mul(h[r * 2 * I + c], h[r * 2 * I + I + c]);
            }
            if (aq) {
#pragma omp for schedule(static)
                for (int64_t r = 0; r < bk; r++) act_row(f8p, &qa, r, act + r * I, I);
            }
            /* w2, scaled by each pair's routing weight, summed into its row's residual */
#pragma omp for schedule(static)
            for (int64_t j = 0; j < dblocks; j++) {
                int64_t n0 = j * 16, nr = D - n0 < 16 ? D - n0 : 16;
                for (int64_t a = 0; a < n_active; a++) {
                    int64_t e = active[a], g0 = group[e], n = group[e + 1] - g0;
                    block(q8, act + g0 * I, I, n, ref(m->w2, m->w2_s, m->w2_p, m->w2_ps, l * E + e, q8, aq), n0, j,
                          nr, I, acc, aq ? &qa : 0, g0, grp);
                    for (int64_t i = 0; i < n; i++) {
                        int64_t p = order[g0 + i];
                        float w = sel_w[p], *o = x + (p / topk) * D + n0;
                        for (int64_t c = 0; c < nr; c++) o[c] += w * acc[i * 16 + c];
                    }
                }
            }
        }
#pragma omp single
        {
            rms_norm_rows(x + (B - out_rows) * D, m->norm, xn, out_rows, D, m->eps);
            if (aq || head8)
                for (int64_t b = 0; b < out_rows; b++) act_row(f8p && !head8, &qxn, b, xn + b * D, D);
        }
        /* an int8 head kept beside int4 or fp8 weights reads its packed copy against the int8
           activations; an fp8 model's without one (no int8 loops) its rows against the fp32 ones */
        linear_for(m->head_quantized ? m->head_quantized : q8, xn, out_rows,
                   (wref){m->head, m->head_s, m->head_p, m->head_ps}, m->V, D, logits, 0, acc,
                   head8 || (aq && !(q8 == 3 && m->head_quantized)) ? &qxn : 0, grp);
    }
    return -1;
}

int infersight_has_avx512(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}
