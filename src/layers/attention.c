/* ds41 attention pieces (spec 3.5-3.13). See attention.h for the contract of each function.
 *
 * Exact mode (ctx->exact): every contraction and sum accumulates in double and is rounded
 * once to FP32 (then to BF16 where the spec says so); exp via ds41_expf_x (double, rounded
 * once). Fast mode: the same sequence of roundings with FP32 accumulation. */
#include "attention.h"
#include "linear_fast.h"

#include <float.h>
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats.h"

/* Scratch for intermediate rows. Running out of memory mid-forward is not recoverable for a
 * void kernel; say so and stop rather than corrupt results. */
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "ds41: out of memory allocating %zu bytes in attention\n", n);
        abort();
    }
    return p;
}

static inline float bf16r(float x) { return ds41_bf16_round(x); }

float ds41_attn_scale(const ds41_config *cfg) { return (float)pow((double)cfg->head_dim, -0.5); }

/* dot of two float vectors: exact = double sum rounded to FP32; fast = FP32 sum. */
static inline float dot_f(const ds41_ctx *ctx, const float *a, const float *b, int n) {
    if (ctx->exact) {
        double s = 0.0;
        for (int i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
        return (float)s;
    }
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* ====================================================================== 3.5 query path */

void ds41_attn_query_c(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw, const float *x,
                       int T, float *cq) {
    int ql = cfg->q_lora_rank;
    float *tmp = xmalloc((size_t)T * ql * sizeof(float));
    ds41_linear_fp8(ctx, &lw->wq_a, x, T, tmp);
    ds41_rmsnorm(ctx, tmp, lw->q_norm, T, ql, cfg->norm_eps, cq);
    free(tmp);
}

void ds41_attn_query_q(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                       const ds41_rope *rope, const float *cq, int T, const int *pos, float *q) {
    int H = cfg->n_heads, D = cfg->head_dim, rd = cfg->rope_dim;
    ds41_linear_fp8(ctx, &lw->wq_b, cq, T, q);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            ds41_rope_apply(rope, q + ((size_t)t * H + h) * D + (D - rd), pos[t], 0);
}

void ds41_attn_query(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                     const ds41_rope *rope, const float *x, int T, const int *pos, float *cq, float *q) {
    ds41_attn_query_c(ctx, cfg, lw, x, T, cq);
    ds41_attn_query_q(ctx, cfg, lw, rope, cq, T, pos, q);
}

/* ====================================================================== 3.7 SWA K */

void ds41_attn_swa_k(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                     const ds41_rope *rope, const float *x, int T, const int *pos, float *k, uint8_t *rec) {
    int D = cfg->head_dim, rd = cfg->rope_dim, rb = ds41_swa_rec_bytes(cfg);
    float *tmp = xmalloc((size_t)T * D * sizeof(float));
    uint8_t *one = xmalloc((size_t)rb);
    ds41_linear_fp8(ctx, &lw->wkv, x, T, tmp);
    ds41_rmsnorm(ctx, tmp, lw->kv_norm, T, D, cfg->norm_eps, k);
    for (int t = 0; t < T; t++) {
        float *kt = k + (size_t)t * D;
        ds41_rope_apply(rope, kt + (D - rd), pos[t], 0);
        /* Q8 over all dims, RoPE tail included; the attention reads the dequantized record so
         * the values it sees are exactly what the ring will hold. */
        uint8_t *r = rec ? rec + (size_t)t * rb : one;
        ds41_pack_q8(kt, D, r, r + D);
        ds41_unpack_q8(r, r + D, D, kt);
    }
    free(one);
    free(tmp);
}

/* E4M3 code -> its FP32 value (ds41_e4m3_to_f32, NaN codes included), for the gathers below */
static float e4m3_f32[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;
static void e4m3_f32_fill(void) {
    for (int c = 0; c < 256; c++) e4m3_f32[c] = ds41_e4m3_to_f32((uint8_t)c);
}

/* ds41_unpack_q8 of every record, 8 elements at a time: each lane the same operations (the code's
 * value from a table made by ds41_e4m3_to_f32, one FP32 multiply by the group's UE8M0 scale, the
 * BF16 rounding's integer steps), so the same bits (tests/test_attention.c); decode unpacks the
 * whole SWA ring of every layer each step, where the scalar calls cost about 1 % of the step. */
void ds41_swa_rec_unpack(const ds41_config *cfg, const uint8_t *rec, int n, float *out) {
    int D = cfg->head_dim, rb = ds41_swa_rec_bytes(cfg);
    if (D % 32) {
        for (int i = 0; i < n; i++) ds41_unpack_q8(rec + (size_t)i * rb, rec + (size_t)i * rb + D, D, out + (size_t)i * D);
        return;
    }
    pthread_once(&e4m3_once, e4m3_f32_fill);
    for (int i = 0; i < n; i++) {
        const uint8_t *c = rec + (size_t)i * rb, *sc = c + D;
        float *o = out + (size_t)i * D;
        for (int g = 0; g < D; g += 32) {
            __m256 s = _mm256_set1_ps(ds41_ue8m0_to_f32(sc[g / 32]));
            for (int k = g; k < g + 32; k += 8) {
                __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(c + k)));
                __m256 v = _mm256_i32gather_ps(e4m3_f32, idx, 4);
                _mm256_storeu_ps(o + k, ds41_bf16_round8(_mm256_mul_ps(v, s)));
            }
        }
    }
}

/* ====================================================================== 3.8 compressor */

void ds41_compress_r1(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                      const float *x, int T, float *c) {
    int D = cfg->head_dim;
    float *tmp = xmalloc((size_t)T * D * sizeof(float));
    ds41_linear_bf16(ctx, &lw->comp_wkv, x, T, tmp, 1);
    ds41_rmsnorm(ctx, tmp, lw->comp_norm, T, D, cfg->norm_eps, c);
    free(tmp);
}

void ds41_compress_proj(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                        const float *x, int T, float *kv, float *sc) {
    (void)cfg;
    ds41_linear_bf16(ctx, &lw->comp_wkv, x, T, kv, 0);
    ds41_linear_bf16(ctx, &lw->comp_wgate, x, T, sc, 0);
}

/* The pooled (pre-norm) row of one group: per channel softmax over its r tokens, FP32 products
 * summed, one BF16 rounding. */
static void pool_row(const ds41_ctx *ctx, int D, const float *const *kv_rows, const float *const *sc_rows, int r,
                     float *pooled) {
    for (int d = 0; d < D; d++) {
        float w[DS41_MAX_RATIO];
        if (ctx->exact) {
            /* one softmax operation entirely in double, each weight rounded once */
            double m = sc_rows[0][d];
            for (int i = 1; i < r; i++) if ((double)sc_rows[i][d] > m) m = sc_rows[i][d];
            double e[DS41_MAX_RATIO], s = 0.0;
            for (int i = 0; i < r; i++) { e[i] = exp((double)sc_rows[i][d] - m); s += e[i]; }
            for (int i = 0; i < r; i++) w[i] = (float)(e[i] / s);
        } else {
            float m = sc_rows[0][d];
            for (int i = 1; i < r; i++) if (sc_rows[i][d] > m) m = sc_rows[i][d];
            float e[DS41_MAX_RATIO], s = 0.0f;
            for (int i = 0; i < r; i++) { e[i] = expf(sc_rows[i][d] - m); s += e[i]; }
            for (int i = 0; i < r; i++) w[i] = e[i] / s;
        }
        /* FP32 products, then an r-term reduction */
        if (ctx->exact) {
            double s = 0.0;
            for (int i = 0; i < r; i++) s += (double)(float)(kv_rows[i][d] * w[i]);
            pooled[d] = bf16r((float)s);
        } else {
            float s = 0.0f;
            for (int i = 0; i < r; i++) s += kv_rows[i][d] * w[i];
            pooled[d] = bf16r(s);
        }
    }
}

void ds41_compress_pool(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                        const float *const *kv_rows, const float *const *sc_rows, int r, float *c) {
    int D = cfg->head_dim;
    float *pooled = xmalloc((size_t)D * sizeof(float));
    pool_row(ctx, D, kv_rows, sc_rows, r, pooled);
    ds41_rmsnorm(ctx, pooled, lw->comp_norm, 1, D, cfg->norm_eps, c);
    free(pooled);
}

/* An entry's records from its normalised index key ik (index_head_dim) and pre-RoPE latent c
 * (head_dim), both modified: RoPE on their tails at pos, then Q4mx / Q4nv. */
static void entry_records(const ds41_config *cfg, const ds41_rope *rope, float *ik, float *c, int pos, uint8_t *ik_rec,
                          uint8_t *kv_rec) {
    int D = cfg->head_dim, rd = cfg->rope_dim, ID = cfg->index_head_dim;
    ds41_rope_apply(rope, ik + (ID - rd), pos, 0);
    ds41_pack_q4mx(ik, ID, ik_rec, ik_rec + ID / 2);
    ds41_rope_apply(rope, c + (D - rd), pos, 0);
    ds41_pack_q4nv(c, D, kv_rec, kv_rec + D / 2);
}

void ds41_compress_entry(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                         const ds41_rope *rope, float *c, int pos, uint8_t *ik_rec, uint8_t *kv_rec) {
    int ID = cfg->index_head_dim;
    float *ik = xmalloc((size_t)ID * 2 * sizeof(float));
    float *tmp = ik + ID;
    /* 1. index key from the pre-RoPE latent */
    ds41_linear_bf16(ctx, &lw->idx_wk, c, 1, tmp, 1);
    ds41_rmsnorm(ctx, tmp, lw->idx_k_norm, 1, ID, cfg->norm_eps, ik);
    /* 2. both records (main KV: RoPE on the latent's tail, then Q4nv) */
    entry_records(cfg, rope, ik, c, pos, ik_rec, kv_rec);
    free(ik);
}

void ds41_compress_r1_fused(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                            const ds41_rope *rope, const float *x, int T, long long j0, uint8_t *const *ik_rec,
                            uint8_t *const *kv_rec) {
    enum { TILE = 16 };
    int D = cfg->head_dim, ID = cfg->index_head_dim, dim = cfg->dim;
    float *proj = xmalloc((size_t)TILE * (2 * (size_t)D + 2 * (size_t)ID) * sizeof(float));
    float *c = proj + (size_t)TILE * D, *ikp = c + (size_t)TILE * D, *ik = ikp + (size_t)TILE * ID;
    for (int t0 = 0; t0 < T; t0 += TILE) {
        int n = T - t0 < TILE ? T - t0 : TILE;
        /* the tile's latents, its index keys (one multi-row product instead of n single rows),
         * then the records, while the tile is in cache */
        ds41_linear_bf16(ctx, &lw->comp_wkv, x + (size_t)t0 * dim, n, proj, 1);
        ds41_rmsnorm(ctx, proj, lw->comp_norm, n, D, cfg->norm_eps, c);
        ds41_linear_bf16(ctx, &lw->idx_wk, c, n, ikp, 1);
        ds41_rmsnorm(ctx, ikp, lw->idx_k_norm, n, ID, cfg->norm_eps, ik);
        for (int i = 0; i < n; i++)
            entry_records(cfg, rope, ik + (size_t)i * ID, c + (size_t)i * D, (int)(j0 + t0 + i), ik_rec[t0 + i],
                          kv_rec[t0 + i]);
    }
    free(proj);
}

void ds41_compress_pool_fused(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                              const ds41_rope *rope, const float *const *kv_rows, const float *const *sc_rows, int r,
                              int n, const int *pos, uint8_t *const *ik_rec, uint8_t *const *kv_rec) {
    enum { TILE = 16 };
    int D = cfg->head_dim, ID = cfg->index_head_dim;
    float *pooled = xmalloc((size_t)TILE * (2 * (size_t)D + 2 * (size_t)ID) * sizeof(float));
    float *c = pooled + (size_t)TILE * D, *ikp = c + (size_t)TILE * D, *ik = ikp + (size_t)TILE * ID;
    for (int e0 = 0; e0 < n; e0 += TILE) {
        int m = n - e0 < TILE ? n - e0 : TILE;
        /* the tile's groups pooled, normalised, their index keys in one m-row product, then the
         * records, while the tile is in cache */
        for (int i = 0; i < m; i++)
            pool_row(ctx, D, kv_rows + (size_t)(e0 + i) * r, sc_rows + (size_t)(e0 + i) * r, r, pooled + (size_t)i * D);
        ds41_rmsnorm(ctx, pooled, lw->comp_norm, m, D, cfg->norm_eps, c);
        ds41_linear_bf16(ctx, &lw->idx_wk, c, m, ikp, 1);
        ds41_rmsnorm(ctx, ikp, lw->idx_k_norm, m, ID, cfg->norm_eps, ik);
        for (int i = 0; i < m; i++)
            entry_records(cfg, rope, ik + (size_t)i * ID, c + (size_t)i * D, pos[e0 + i], ik_rec[e0 + i], kv_rec[e0 + i]);
    }
    free(pooled);
}

void ds41_kv_rec_unpack(const ds41_config *cfg, const uint8_t *rec, int n, float *out) {
    int D = cfg->head_dim, rb = ds41_kv_rec_bytes(cfg);
    for (int i = 0; i < n; i++)
        ds41_unpack_q4nv(rec + (size_t)i * rb, rec + (size_t)i * rb + D / 2, D, out + (size_t)i * D);
}

void ds41_ik_rec_unpack(const ds41_config *cfg, const uint8_t *rec, int n, float *out) {
    int D = cfg->index_head_dim, rb = ds41_ik_rec_bytes(cfg);
    for (int i = 0; i < n; i++)
        ds41_unpack_q4mx(rec + (size_t)i * rb, rec + (size_t)i * rb + D / 2, D, out + (size_t)i * D);
}

/* ====================================================================== 3.9 indexer */

void ds41_indexer_query(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                        const ds41_rope *rope, const float *cq, const float *x, int T, const int *pos,
                        float *iq, float *wt) {
    int NH = cfg->index_n_heads, ID = cfg->index_head_dim, rd = cfg->rope_dim;
    ds41_linear_fp8(ctx, &lw->idx_wq_b, cq, T, iq);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            float *v = iq + ((size_t)t * NH + h) * ID;
            ds41_rope_apply(rope, v + (ID - rd), pos[t], 0);
            ds41_q4mx_qdq(v, ID);
        }
    /* index_head_dim^-0.5 * index_n_heads^-0.5, formed in double as the reference's Python
     * scalar and rounded to FP32 (a power of two for every shipped config, so exact) */
    float c = (float)(pow((double)ID, -0.5) * pow((double)NH, -0.5));
    ds41_linear_bf16(ctx, &lw->idx_weights_proj, x, T, wt, 1);
    for (size_t i = 0; i < (size_t)T * NH; i++) wt[i] = bf16r(wt[i] * c);
}

/* The scores of 16 entries at a time, one entry per SIMD lane, each lane running exactly the
 * scalar sequence of operations of its entry (so the result is bit for bit the scalar loop's):
 *   the 16 keys are transposed into tile[d][16] (L1), then for every head h:
 *   fast:  dot_f's four FP32 partial sums s_m += q[i + m] * k[i + m] (a rounded product, then
 *          a rounded sum: no FMA), i = 0, 4, ..; dot = (s0 + s1) + (s2 + s3);
 *   exact: one double sum in increasing i of the exact products, rounded to FP32;
 *   then bf16, ReLU (max(s, +0): +0 for -0 and NaN, as s > 0 ? s : 0), bf16(r * w_h) added to
 *   the head sum (FP32 in fast mode, double in exact mode) in increasing h; the score is bf16
 *   of the sum. Each query's keys are read once for all heads instead of once per head, and
 *   the head loop's 16 lanes replace 16 scalar dot products. Entries are split over the
 *   thread pool by blocks of 16 (a lane's result does not depend on its block or thread). */
#define IXL 16

/* float -> BF16 -> float, round to nearest even; NaN kept quiet (ds41_bf16_from_f32) */
static inline __m256 bf16r_v(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
    __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    r = _mm256_blendv_epi8(r, q, nan);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000)));
}

typedef struct ixs_job {
    const ds41_ctx *ctx;
    const float *iq, *wt, *ik;
    int NH, ID, E, n_vis;
    float *scores;
} ixs_job;

/* entries [j0, j0 + n) (n <= IXL) of a job into scores */
static void ixs_block(const ixs_job *jb, int j0, int n, float *tile) {
    int ID = jb->ID, NH = jb->NH;
    if (n == IXL && ID % 8 == 0) {
        /* 8 x 8 transposes in registers: keys l0 .. l0 + 7, elements d0 .. d0 + 7 */
        for (int l0 = 0; l0 < IXL; l0 += 8)
            for (int d0 = 0; d0 < ID; d0 += 8) {
                const float *src = jb->ik + (size_t)(j0 + l0) * ID + d0;
                __m256 r[8], t[8];
                for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(src + (size_t)k * ID);
                for (int k = 0; k < 8; k += 2) {
                    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
                    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
                }
                for (int k = 0; k < 8; k += 4) {
                    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
                    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
                    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
                    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
                }
                /* r[0..3]: elements d0 + {0, 1, 2, 3} of keys 0-3 (low half) and 4-7 (high half) */
                for (int k = 0; k < 4; k++) {
                    float *o = tile + (size_t)(d0 + k) * IXL + l0;
                    float *o4 = tile + (size_t)(d0 + k + 4) * IXL + l0;
                    _mm256_storeu_ps(o, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
                    _mm256_storeu_ps(o4, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
                }
            }
    } else {
        for (int d = 0; d < ID; d++) {
            float *row = tile + (size_t)d * IXL;
            for (int l = 0; l < IXL; l++) row[l] = l < n ? jb->ik[(size_t)(j0 + l) * ID + d] : 0.0f;
        }
    }
    const __m256 zero = _mm256_setzero_ps();
    float out[IXL];
    if (!jb->ctx->exact) {
        __m256 sum0 = zero, sum1 = zero;
        for (int h = 0; h < NH; h++) {
            const float *q = jb->iq + (size_t)h * ID;
            __m256 a[4][2];
            for (int m = 0; m < 4; m++) a[m][0] = a[m][1] = zero;
            for (int i = 0; i + 4 <= ID; i += 4)
                for (int m = 0; m < 4; m++) {
                    __m256 qv = _mm256_set1_ps(q[i + m]);
                    const float *k = tile + (size_t)(i + m) * IXL;
                    a[m][0] = _mm256_add_ps(a[m][0], _mm256_mul_ps(qv, _mm256_loadu_ps(k)));
                    a[m][1] = _mm256_add_ps(a[m][1], _mm256_mul_ps(qv, _mm256_loadu_ps(k + 8)));
                }
            for (int i = ID & ~3; i < ID; i++) {   /* dot_f's tail, into s0 */
                __m256 qv = _mm256_set1_ps(q[i]);
                const float *k = tile + (size_t)i * IXL;
                a[0][0] = _mm256_add_ps(a[0][0], _mm256_mul_ps(qv, _mm256_loadu_ps(k)));
                a[0][1] = _mm256_add_ps(a[0][1], _mm256_mul_ps(qv, _mm256_loadu_ps(k + 8)));
            }
            __m256 w = _mm256_set1_ps(jb->wt[h]);
            for (int g = 0; g < 2; g++) {
                __m256 d = _mm256_add_ps(_mm256_add_ps(a[0][g], a[1][g]), _mm256_add_ps(a[2][g], a[3][g]));
                __m256 r = _mm256_max_ps(bf16r_v(d), zero);
                __m256 t = bf16r_v(_mm256_mul_ps(r, w));
                if (g == 0) sum0 = _mm256_add_ps(sum0, t);
                else sum1 = _mm256_add_ps(sum1, t);
            }
        }
        _mm256_storeu_ps(out, bf16r_v(sum0));
        _mm256_storeu_ps(out + 8, bf16r_v(sum1));
    } else {
        const __m256d dz = _mm256_setzero_pd();
        __m256d sum[4] = { dz, dz, dz, dz };
        /* two heads per pass: 8 independent double sums (each lane's sum stays in increasing i),
         * the head sum then takes head h before h + 1 */
        for (int h = 0; h < NH; h += 2) {
            int nh = h + 1 < NH ? 2 : 1;
            __m256d a[2][4] = { { dz, dz, dz, dz }, { dz, dz, dz, dz } };
            const float *q0 = jb->iq + (size_t)h * ID, *q1 = q0 + (nh > 1 ? ID : 0);
            for (int i = 0; i < ID; i++) {
                __m256d qv0 = _mm256_set1_pd((double)q0[i]), qv1 = _mm256_set1_pd((double)q1[i]);
                const float *k = tile + (size_t)i * IXL;
                for (int g = 0; g < 4; g++) {
                    __m256d kv = _mm256_cvtps_pd(_mm_loadu_ps(k + 4 * g));
                    a[0][g] = _mm256_add_pd(a[0][g], _mm256_mul_pd(qv0, kv));
                    a[1][g] = _mm256_add_pd(a[1][g], _mm256_mul_pd(qv1, kv));
                }
            }
            for (int u = 0; u < nh; u++) {
                __m256 d = _mm256_set_m128(_mm256_cvtpd_ps(a[u][1]), _mm256_cvtpd_ps(a[u][0]));
                __m256 d2 = _mm256_set_m128(_mm256_cvtpd_ps(a[u][3]), _mm256_cvtpd_ps(a[u][2]));
                __m256 w = _mm256_set1_ps(jb->wt[h + u]);
                __m256 t = bf16r_v(_mm256_mul_ps(_mm256_max_ps(bf16r_v(d), zero), w));
                __m256 t2 = bf16r_v(_mm256_mul_ps(_mm256_max_ps(bf16r_v(d2), zero), w));
                sum[0] = _mm256_add_pd(sum[0], _mm256_cvtps_pd(_mm256_castps256_ps128(t)));
                sum[1] = _mm256_add_pd(sum[1], _mm256_cvtps_pd(_mm256_extractf128_ps(t, 1)));
                sum[2] = _mm256_add_pd(sum[2], _mm256_cvtps_pd(_mm256_castps256_ps128(t2)));
                sum[3] = _mm256_add_pd(sum[3], _mm256_cvtps_pd(_mm256_extractf128_ps(t2, 1)));
            }
        }
        for (int g = 0; g < 2; g++) {
            __m256 f = _mm256_set_m128(_mm256_cvtpd_ps(sum[2 * g + 1]), _mm256_cvtpd_ps(sum[2 * g]));
            _mm256_storeu_ps(out + 8 * g, bf16r_v(f));
        }
    }
    for (int l = 0; l < n; l++) jb->scores[j0 + l] = j0 + l < jb->n_vis ? out[l] : -INFINITY;
}

static void ixs_range(void *arg, int b0, int b1) {
    const ixs_job *jb = arg;
    /* the tile on the stack up to index_head_dim 256 (production: 128), no allocation per call */
    _Alignas(64) float local[256 * IXL];
    float *tile = jb->ID <= 256 ? local : aligned_alloc(64, (size_t)jb->ID * IXL * sizeof(float));
    if (!tile) abort();
    for (int b = b0; b < b1; b++) {
        int j0 = b * IXL, n = jb->E - j0 < IXL ? jb->E - j0 : IXL;
        /* entries past the visible ones are -inf whatever their keys: skip the work */
        if (j0 >= jb->n_vis) { for (int l = 0; l < n; l++) jb->scores[j0 + l] = -INFINITY; continue; }
        ixs_block(jb, j0, n, tile);
    }
    if (tile != local) free(tile);
}

void ds41_indexer_scores(const ds41_ctx *ctx, const ds41_config *cfg, const float *iq, const float *wt,
                         const float *ik, int E, int n_visible, float *scores) {
    if (E <= 0) return;
    ixs_job jb = { ctx, iq, wt, ik, cfg->index_n_heads, cfg->index_head_dim, E, n_visible, scores };
    int nb = (E + IXL - 1) / IXL;
    /* a block is NH * ID * 16 multiply-adds (32 x 128 x 16 = 64 K at production width): split
     * over the pool from 64 blocks on */
    if (ctx->pool && nb >= 64) ds41_parallel_for(ctx, nb, ixs_range, &jb);
    else ixs_range(&jb, 0, nb);
}

/* The scalar definition of ds41_indexer_scores (tests compare the two bit for bit). */
void ds41_indexer_scores_ref(const ds41_ctx *ctx, const ds41_config *cfg, const float *iq, const float *wt,
                             const float *ik, int E, int n_visible, float *scores) {
    int NH = cfg->index_n_heads, ID = cfg->index_head_dim;
    for (int j = 0; j < E; j++) {
        if (j >= n_visible) { scores[j] = -INFINITY; continue; }
        const float *k = ik + (size_t)j * ID;
        if (ctx->exact) {
            double sum = 0.0;
            for (int h = 0; h < NH; h++) {
                float s = bf16r(dot_f(ctx, iq + (size_t)h * ID, k, ID));
                float r = s > 0.0f ? s : 0.0f;
                sum += (double)bf16r(r * wt[h]);
            }
            scores[j] = bf16r((float)sum);
        } else {
            float sum = 0.0f;
            for (int h = 0; h < NH; h++) {
                float s = bf16r(dot_f(ctx, iq + (size_t)h * ID, k, ID));
                float r = s > 0.0f ? s : 0.0f;
                sum += bf16r(r * wt[h]);
            }
            scores[j] = bf16r(sum);
        }
    }
}

/* ---- 3.9 indexer scores on the packed index keys: integer dots ----
 * Every index-key element is code2 * 2^(sb - 128) exactly (code2 = 2 e2m1 in {0, +-1 .. +-12},
 * sb the block's UE8 byte; the BF16 rounding of the dequantization is exact for sb < 253) and
 * every element of a Q4mx-QDQ'd query is an integer of at most 4 bits times a power of two. So
 * per head, with the query's blocks on one unit 2^U (ints q' <= 15 * 2^qs, qs the spread of the
 * blocks' units) and an entry's blocks on 2^uk (ints k' <= 12 * 2^ks), the dot is I * 2^(U + uk)
 * with I = sum q' k' an exact integer below 2^20. Both definitions of the dot (dot_f: FP32,
 * four interleaved sums, in fast mode; the double chain in exact mode) then compute I * 2^(U +
 * uk) exactly: every product is an integer multiple of 2^(U + uk) and every partial sum stays
 * below 2^20 such units, inside FP32's 24 bits, as long as U + uk >= -126 (no FP32 subnormal
 * products) and the value stays far below FP32's overflow. A pair (head, entry) outside those
 * bounds (qs + ks > 5, which could also saturate vpmaddubsw below; an entry with ks > 3 or a
 * scale byte above 252, whose codes dequantize to inf or NaN; a unit out of range; a head
 * whose query does not decompose, qs > 3) takes dot_f on the dequantized record instead: the
 * definition either way, so the scores equal ds41_indexer_scores_ref's bit for bit
 * (test_indexer_scores_packed).
 *
 * Kernel (AVX2): 8 entries per pass; their keys decoded by one byte shuffle per 16 codes, as
 * k' + 12 * 2^ks (unsigned, at most 192), transposed so that a ymm holds 4 elements of each of
 * the 8 entries; per head and 4 elements one vpmaddubsw against the head's 4 ints broadcast
 * and one vpmaddwd; the offset comes back out as (12 sum q') * 2^ks. Within a block the
 * elements are taken evens first, then odds (the nibble order of the record), the query's
 * ints permuted the same way: an integer sum does not depend on its order. */
#define IXQ_L 8

long long ds41_indexer_dotf_pairs;

typedef struct ixq_job {
    const ds41_ctx *ctx;
    const ds41_config *cfg;
    const float *iq, *wt;
    const ds41_ik_keys *keys;
    int NH, ID, E, n_vis;
    const int8_t *q;           /* [NH][ID] ints, block element order evens then odds */
    const int *U, *qs, *qsum12;  /* per head: unit, spread (> 3: the head takes dot_f), 12 sum q' */
    float *scores;
} ixq_job;

static inline const uint8_t *ik_key_rec(const ds41_ik_keys *k, long long j) {
    return k->pages[j / k->per_page] + k->off + (size_t)(j % k->per_page) * (size_t)k->rec_bytes;
}

/* lut[ks][sh][c] = (code2(c) << sh) + (12 << ks), sh <= ks <= 3 */
static uint8_t ixq_lut[4][4][16];
static pthread_once_t ixq_once = PTHREAD_ONCE_INIT;
static void ixq_lut_init(void) {
    static const int mag[8] = { 0, 1, 2, 3, 4, 6, 8, 12 };
    for (int ks = 0; ks < 4; ks++)
        for (int sh = 0; sh <= ks; sh++)
            for (int c = 0; c < 16; c++)
                ixq_lut[ks][sh][c] = (uint8_t)((c & 8 ? -mag[c & 7] : mag[c & 7]) * (1 << sh) + (12 << ks));
}

/* 8 x 8 transpose of 32-bit elements */
static inline void tr8x8_epi32(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        r[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* entries [j0, j0 + n) (n <= IXQ_L); tile: ID / 4 ymm; d: NH * IXQ_L floats; kf: IXQ_L * ID floats */
static void ixq_block(const ixq_job *jb, long long j0, int n, __m256i *tile, float *d, float *kf) {
    const int ID = jb->ID, NH = jb->NH, nb = ID / 32;
    int uk[IXQ_L], ks[IXQ_L], bad[IXQ_L];
    const uint8_t *rec[IXQ_L];
    for (int l = 0; l < IXQ_L; l++) {
        bad[l] = 1; uk[l] = 0; ks[l] = 0;
        rec[l] = l < n ? ik_key_rec(jb->keys, j0 + l) : NULL;
        if (!rec[l]) continue;
        const uint8_t *sb = rec[l] + ID / 2;
        int mn = 255, mx = 0;
        for (int b = 0; b < nb; b++) {
            mn = sb[b] < mn ? sb[b] : mn;
            mx = sb[b] > mx ? sb[b] : mx;
        }
        if (mx > 252 || mx - mn > 3) continue;   /* 255: NaN; 253, 254: 6 * 2^(sb - 127) is inf */
        bad[l] = 0; uk[l] = mn - 128; ks[l] = mx - mn;
    }
    /* decode and transpose, one block of 32 elements (8 groups of 4) at a time */
    for (int b = 0; b < nb; b++) {
        __m256i r[8];
        for (int l = 0; l < IXQ_L; l++) {
            if (bad[l]) { r[l] = _mm256_setzero_si256(); continue; }
            const uint8_t *sb = rec[l] + ID / 2;
            __m128i lut = _mm_loadu_si128((const __m128i *)ixq_lut[ks[l]][sb[b] - (uk[l] + 128)]);
            __m128i raw = _mm_loadu_si128((const __m128i *)(rec[l] + 16 * b)), m4 = _mm_set1_epi8(15);
            __m128i ev = _mm_shuffle_epi8(lut, _mm_and_si128(raw, m4));
            __m128i od = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(raw, 4), m4));
            r[l] = _mm256_set_m128i(od, ev);
        }
        tr8x8_epi32(r);
        for (int g = 0; g < 8; g++) _mm256_store_si256(tile + 8 * b + g, r[g]);
    }
    const __m256i ukv = _mm256_loadu_si256((const __m256i *)uk), ksv = _mm256_loadu_si256((const __m256i *)ks);
    const __m256i badv = _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)bad), _mm256_setzero_si256());
    const __m256i ones = _mm256_set1_epi16(1);
    int need_kf = 0;
    uint32_t fix[64] = { 0 };   /* per head (NH <= 64 here): lanes that take dot_f */
    for (int h = 0; h < NH; h++) {
        const int8_t *q = jb->q + (size_t)h * ID;
        if (jb->qs[h] > 3) { fix[h] = (1u << n) - 1; need_kf |= fix[h] != 0; continue; }
        __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
        for (int g = 0; g < ID / 4; g += 2) {
            int32_t w0, w1;
            memcpy(&w0, q + 4 * g, 4);
            memcpy(&w1, q + 4 * g + 4, 4);
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_load_si256(tile + g), _mm256_set1_epi32(w0)), ones));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_load_si256(tile + g + 1), _mm256_set1_epi32(w1)), ones));
        }
        __m256i I = _mm256_sub_epi32(_mm256_add_epi32(a0, a1), _mm256_sllv_epi32(_mm256_set1_epi32(jb->qsum12[h]), ksv));
        __m256i e = _mm256_add_epi32(ukv, _mm256_set1_epi32(jb->U[h]));
        __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(-126), e), _mm256_cmpgt_epi32(e, _mm256_set1_epi32(100)));
        out = _mm256_or_si256(out, _mm256_cmpgt_epi32(_mm256_add_epi32(ksv, _mm256_set1_epi32(jb->qs[h])), _mm256_set1_epi32(5)));
        out = _mm256_or_si256(out, badv);
        __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
        _mm256_storeu_ps(d + (size_t)h * IXQ_L, _mm256_mul_ps(_mm256_cvtepi32_ps(I), scale));
        fix[h] = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(out)) & ((1u << n) - 1);
        need_kf |= fix[h] != 0;
    }
    if (need_kf) {   /* the pairs outside the bounds: dot_f on the dequantized records */
        uint32_t any = 0;
        long long pairs = 0;
        for (int h = 0; h < NH; h++) {
            any |= fix[h];
            pairs += __builtin_popcount(fix[h]);
        }
        __atomic_fetch_add(&ds41_indexer_dotf_pairs, pairs, __ATOMIC_RELAXED);
        for (int l = 0; l < n; l++)
            if (any >> l & 1) ds41_ik_rec_unpack(jb->cfg, rec[l], 1, kf + (size_t)l * ID);
        for (int h = 0; h < NH; h++)
            for (int l = 0; l < n; l++)
                if (fix[h] >> l & 1) d[(size_t)h * IXQ_L + l] = dot_f(jb->ctx, jb->iq + (size_t)h * ID, kf + (size_t)l * ID, ID);
    }
    /* the heads' sum, as ixs_block */
    const __m256 zero = _mm256_setzero_ps();
    float o[IXQ_L];
    if (!jb->ctx->exact) {
        __m256 sum = zero;
        for (int h = 0; h < NH; h++) {
            __m256 r = _mm256_max_ps(bf16r_v(_mm256_loadu_ps(d + (size_t)h * IXQ_L)), zero);
            sum = _mm256_add_ps(sum, bf16r_v(_mm256_mul_ps(r, _mm256_set1_ps(jb->wt[h]))));
        }
        _mm256_storeu_ps(o, bf16r_v(sum));
    } else {
        __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
        for (int h = 0; h < NH; h++) {
            __m256 r = _mm256_max_ps(bf16r_v(_mm256_loadu_ps(d + (size_t)h * IXQ_L)), zero);
            __m256 t = bf16r_v(_mm256_mul_ps(r, _mm256_set1_ps(jb->wt[h])));
            s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(t)));
            s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(t, 1)));
        }
        _mm256_storeu_ps(o, bf16r_v(_mm256_set_m128(_mm256_cvtpd_ps(s1), _mm256_cvtpd_ps(s0))));
    }
    for (int l = 0; l < n; l++) jb->scores[j0 + l] = j0 + l < jb->n_vis ? o[l] : -INFINITY;
}

static void ixq_range(void *arg, int b0, int b1) {
    const ixq_job *jb = arg;
    size_t tb = (size_t)jb->ID / 4 * sizeof(__m256i), db = (size_t)jb->NH * IXQ_L * sizeof(float);
    size_t nbuf = (tb + db + (size_t)IXQ_L * jb->ID * sizeof(float) + 63) & ~(size_t)63;   /* a multiple of the alignment */
    uint8_t *buf = aligned_alloc(64, nbuf);
    if (!buf) abort();
    for (int b = b0; b < b1; b++) {
        long long j0 = (long long)b * IXQ_L;
        int n = jb->E - j0 < IXQ_L ? (int)(jb->E - j0) : IXQ_L;
        if (j0 >= jb->n_vis) { for (int l = 0; l < n; l++) jb->scores[j0 + l] = -INFINITY; continue; }
        ixq_block(jb, j0, n, (__m256i *)buf, (float *)(buf + tb), (float *)(buf + tb + db));
    }
    free(buf);
}

/* The query's ints (see above): per head and block the unit u = ilogb(max |v|) - 3 (ints of at
 * most 15), U the smallest over the head's nonzero blocks; 0 when an element is not an integer
 * of at most 15 units or not finite (the head then takes dot_f) */
static int ixq_query(const float *v, int ID, int8_t *q, int *U, int *qs, int *qsum12) {
    int u[16], lo = INT_MAX, hi = INT_MIN;
    for (int b = 0; b < ID / 32; b++) {
        float m = 0.0f;
        for (int i = 0; i < 32; i++) {
            float a = fabsf(v[32 * b + i]);
            if (!(a <= FLT_MAX)) return 0;   /* inf, NaN */
            m = a > m ? a : m;
        }
        u[b] = m > 0.0f ? ilogbf(m) - 3 : INT_MAX;
        if (m > 0.0f) { lo = u[b] < lo ? u[b] : lo; hi = u[b] > hi ? u[b] : hi; }
    }
    if (lo == INT_MAX) lo = hi = 0;   /* all zero: every dot is +0 */
    *U = lo;
    *qs = hi - lo;
    if (*qs > 3) return 0;
    int sum = 0;
    for (int b = 0; b < ID / 32; b++)
        for (int i = 0; i < 32; i++) {
            double t = u[b] == INT_MAX ? 0.0 : ldexp((double)v[32 * b + i], -u[b]);
            if (t != rint(t) || fabs(t) > 15.0) return 0;
            int x = (int)t * (u[b] == INT_MAX ? 0 : 1 << (u[b] - lo));
            q[32 * b + (i & 1 ? 16 + i / 2 : i / 2)] = (int8_t)x;   /* evens, then odds */
            sum += x;
        }
    *qsum12 = 12 * sum;
    return 1;
}

void ds41_indexer_scores_packed(const ds41_ctx *ctx, const ds41_config *cfg, const float *iq, const float *wt,
                                const ds41_ik_keys *keys, int E, int n_visible, float *scores) {
    if (E <= 0) return;
    int NH = cfg->index_n_heads, ID = cfg->index_head_dim;
    if (ID % 32 || ID > 512 || NH > 64) {   /* outside the kernel's shapes: dequantize, then the float kernel */
        float *ik = malloc((size_t)E * ID * sizeof(float));
        if (!ik) abort();
        for (long long j = 0; j < E; j++) ds41_ik_rec_unpack(cfg, ik_key_rec(keys, j), 1, ik + (size_t)j * ID);
        ds41_indexer_scores(ctx, cfg, iq, wt, ik, E, n_visible, scores);
        free(ik);
        return;
    }
    pthread_once(&ixq_once, ixq_lut_init);
    int8_t *q = malloc((size_t)NH * ID);
    int *hd = malloc(sizeof(int) * 3 * NH);
    if (!q || !hd) abort();
    for (int h = 0; h < NH; h++)
        if (!ixq_query(iq + (size_t)h * ID, ID, q + (size_t)h * ID, hd + h, hd + NH + h, hd + 2 * NH + h))
            hd[NH + h] = INT_MAX;   /* dot_f for this head */
    ixq_job jb = { ctx, cfg, iq, wt, keys, NH, ID, E, n_visible, q, hd, hd + NH, hd + 2 * NH, scores };
    int nb = (E + IXQ_L - 1) / IXQ_L;
    if (ctx->pool && nb >= 256) ds41_parallel_for(ctx, nb, ixq_range, &jb);
    else ixq_range(&jb, 0, nb);
    free(q);
    free(hd);
}

/* ====================================================================== 3.11 top-k */

/* k-th largest value of v[n] (1-based k), by quickselect on a copy. */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;   /* position in descending order */
    while (lo < hi) {
        float piv = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > piv) i++;
            while (a[j] < piv) j--;
            if (i <= j) { float t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return a[want];
    }
    return a[want];
}

void ds41_topk(const float *v, int n, int k, int *out, int *idx_scratch) {
    if (k <= 0) return;
    if (k >= n) {
        for (int i = 0; i < n; i++) out[i] = i;
        return;
    }
    float *a = (float *)idx_scratch;   /* ints and floats share size: reuse the scratch */
    _Static_assert(sizeof(float) == sizeof(int), "float/int size");
    memcpy(a, v, (size_t)n * sizeof(float));
    float thr = kth_largest(a, n, k);
    int n_gt = 0;
    for (int i = 0; i < n; i++) n_gt += v[i] > thr;
    /* everything above the threshold, then equal values lowest index first; one ascending
     * pass yields the indices already sorted */
    int ties = k - n_gt, c = 0;
    for (int i = 0; i < n; i++) {
        if (v[i] > thr) out[c++] = i;
        else if (v[i] == thr && ties > 0) { out[c++] = i; ties--; }
    }
}

/* ====================================================================== 3.10 candidates */

void ds41_candidate_blocks(const ds41_config *cfg, const float *scores, int E, int n_visible,
                           uint8_t *keep, int *scratch) {
    int B = cfg->candidate_block_size;
    if (E <= 0 || B <= 0) return;
    int nb = (E + B - 1) / B;
    float *bs = (float *)scratch;
    int *chosen = scratch + nb;
    for (int b = 0; b < nb; b++) {
        float m = -INFINITY;
        for (int j = b * B; j < (b + 1) * B && j < E; j++) if (scores[j] > m) m = scores[j];
        bs[b] = m;
    }
    /* pin the newest (partly filled) block; Python floor division: n_visible = 0 pins the
     * last block (index -1), which cannot matter since no entry is visible then */
    int last = n_visible >= 1 ? (n_visible - 1) / B : nb - 1;
    if (nb > 0) bs[last] = INFINITY;
    int kb = cfg->candidate_topk_blocks < nb ? cfg->candidate_topk_blocks : nb;
    memset(keep, 0, (size_t)nb);
    if (kb <= 0) return;
    /* ds41_topk needs n ints of scratch: the block scores copy lives in a separate buffer */
    int *sc2 = xmalloc((size_t)nb * sizeof(int));
    ds41_topk(bs, nb, kb, chosen, sc2);
    free(sc2);
    for (int i = 0; i < kb; i++)
        if (bs[chosen[i]] != -INFINITY) keep[chosen[i]] = 1;
}

/* ====================================================================== 3.11 index lists */

int ds41_swa_width(const ds41_config *cfg, long long P, int T) {
    long long w = P + T;
    return (int)(w < cfg->window ? w : cfg->window);
}

void ds41_swa_list_positions(const ds41_config *cfg, long long p, long long lo, int W, int32_t *list) {
    long long base = p - cfg->window + 1;
    if (base < lo) base = lo;
    if (base < 0) base = 0;
    for (int i = 0; i < W; i++) {
        long long q = base + i;
        list[i] = q > p ? -1 : (int32_t)q;
    }
}

void ds41_swa_list_decode(const ds41_config *cfg, long long P, int32_t *list) {
    int w = cfg->window;
    int o = (int)(P % w) + 1;
    for (int i = 0; i < w; i++) {
        int slot = (o + i) % w;
        list[i] = slot > P ? -1 : slot;
    }
}

/* ====================================================================== 3.12 sparse attention */

/* Q4nv decode table (P2): q4nv_tab[s][c] = bf16(e2m1(c) * e4m3(s)), the very expression of
 * ds41_unpack_q4nv, so a record decoded through it gives the same floats bit for bit. */
static float q4nv_tab[256][16];
static pthread_once_t q4nv_once = PTHREAD_ONCE_INIT;

static void q4nv_tab_init(void) {
    for (int sb = 0; sb < 256; sb++) {
        float sc = ds41_e4m3_to_f32((uint8_t)sb);
        for (int c = 0; c < 16; c++) q4nv_tab[sb][c] = bf16r(ds41_e2m1_to_f32((uint8_t)c) * sc);
    }
}

/* One packed main-KV record (D/2 code bytes, then D/16 E4M3 scales) into out [D]. */
static inline void q4nv_decode(const uint8_t *rec, int D, float *out) {
    const uint8_t *codes = rec, *scales = rec + D / 2;
    for (int g = 0; g < D; g += 16) {
        const float *t = q4nv_tab[scales[g / 16]];
        const uint8_t *cb = codes + g / 2;
        for (int i = 0; i < 8; i++) {
            out[g + 2 * i] = t[cb[i] & 15u];
            out[g + 2 * i + 1] = t[cb[i] >> 4];
        }
    }
}

void ds41_kv_rec_decode(const uint8_t *rec, int head_dim, float *out) {
    pthread_once(&q4nv_once, q4nv_tab_init);
    q4nv_decode(rec, head_dim, out);
}

/* attention_avx512.c: the AVX-512 forms of dot_v4 and sa_vals4 (same bits), used in fast mode
 * where ds41_kernels_isa() is "avx512" */
void ds41_sa_dot4_avx512(const float *q, size_t qstride, const float *b, int n, float *out);
void ds41_sa_vals4_avx512(const float *const *vr, int nv, int D, const float *const *pb, float *facc);

typedef struct sa_job {
    const ds41_ctx *ctx;
    int zmm;              /* 1: the AVX-512 kernels (fast mode) */
    int H, D, T, L;
    int hc, nch;          /* P3: heads per item and items per query row; otherwise 1 and H */
    const float *q, *sink;
    const ds41_kvset *kv;
    const int32_t *idx;
    float scale;
    float *out;
} sa_job;

#define SA_BLOCK 64

/* Row r of the KV set as floats: a pointer into a float part, or (a packed part, P2) the
 * record decoded into buf; NULL when r is out of range (read as empty). */
static inline const float *kv_row(const ds41_kvset *kv, int r, int D, float *buf) {
    for (int p = 0; p < DS41_KVSET_PARTS; p++) {
        if (r < kv->n[p]) {
            if (kv->rec[p]) { q4nv_decode(kv->rec[p][r], D, buf); return buf; }
            return kv->part[p] + (size_t)r * D;
        }
        r -= kv->n[p];
    }
    return NULL;
}

/* The rows of one block of the list idx[0..n) (tile: n * D floats for decoded records). */
static void sa_rows(const sa_job *j, const int32_t *idx, int n, float *tile, const float **rows) {
    for (int i = 0; i < n; i++)
        rows[i] = idx[i] >= 0 ? kv_row(j->kv, idx[i], j->D, tile + (size_t)i * j->D) : NULL;
}

/* Fast-mode dot products of the sparse attention (AVX2 + FMA, the baseline ISA): two 8-lane
 * accumulators over 16-float steps, one fixed reduction, a scalar tail. dot_v4 computes four
 * such dots of four query heads against one row, loading the row once, each head's lanes in
 * exactly dot_v's order (so the same bits as four dot_v calls). */
static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline float dot_v(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    float r = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static inline void dot_v4(const float *q, size_t qstride, const float *b, int n, float *out) {
    const float *q0 = q, *q1 = q + qstride, *q2 = q + 2 * qstride, *q3 = q + 3 * qstride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 r0 = _mm256_loadu_ps(b + i), r1 = _mm256_loadu_ps(b + i + 8);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i), r0, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + i + 8), r1, a1);
        b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i), r0, b0);
        b1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + i + 8), r1, b1);
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i), r0, c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + i + 8), r1, c1);
        d0 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i), r0, d0);
        d1 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + i + 8), r1, d1);
    }
    out[0] = hsum8(_mm256_add_ps(a0, a1));
    out[1] = hsum8(_mm256_add_ps(b0, b1));
    out[2] = hsum8(_mm256_add_ps(c0, c1));
    out[3] = hsum8(_mm256_add_ps(d0, d1));
    for (; i < n; i++) {
        out[0] += q0[i] * b[i];
        out[1] += q1[i] * b[i];
        out[2] += q2[i] * b[i];
        out[3] += q3[i] * b[i];
    }
}

/* One 64-row block of the recurrence of 3.12 for one head, in three steps so that fast mode
 * can share the value pass between heads: sa_probs (scores, running max, the block's
 * probabilities pb, rounded to BF16, of the non-empty rows, and their sum), the value sum
 * facc = sum_i pb[i] * row[i] (rows in order; sa_vals1, or sa_vals4 for four heads at once), and
 * sa_fold (acc = acc * f + facc, den = den * f + bsum). dots (fast mode, may be NULL): the q.k
 * products of the block's rows, already computed (P3's four-head blocking). */
typedef struct { float m_new, f, bsum; int nv; float pb[SA_BLOCK]; } sa_probs_t;

static void sa_probs(const ds41_ctx *ctx, const float *qh, const float *const *rows, int n, int D, float scale,
                     float m, const float *dots, sa_probs_t *o) {
    float s[SA_BLOCK], p[SA_BLOCK];
    float bmax = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!rows[i]) s[i] = -INFINITY;
        else if (ctx->exact) s[i] = dot_f(ctx, qh, rows[i], D) * scale;
        else s[i] = (dots ? dots[i] : dot_v(qh, rows[i], D)) * scale;
        if (s[i] > bmax) bmax = s[i];
    }
    o->m_new = m > bmax ? m : bmax;
    o->f = ds41_expf_x(ctx, m - o->m_new);
    for (int i = 0; i < n; i++) p[i] = rows[i] ? ds41_expf_x(ctx, s[i] - o->m_new) : 0.0f;
    o->nv = 0;
    if (ctx->exact) {
        double ds = 0.0;
        for (int i = 0; i < n; i++) ds += p[i];
        o->bsum = (float)ds;
    } else {
        o->bsum = 0.0f;
        for (int i = 0; i < n; i++) o->bsum += p[i];
    }
    for (int i = 0; i < n; i++)
        if (rows[i]) o->pb[o->nv++] = bf16r(p[i]);
}

/* Fast mode's value sums of NH heads (1 or 4) over the block's nv non-empty rows vr[] (in
 * order): facc[h * D + d] = fma chain over the rows from +0, as the per-row loop it replaces
 * (vector part) and mul + add (the D % 8 tail). Each row's 16-float slice is loaded once for
 * the NH heads, and the sums stay in registers for the whole block. */
static inline __attribute__((always_inline)) void sa_vals_k(const float *const *vr, int nv, int D, int NH,
                                                          const sa_probs_t *const *pr, float *facc) {
    int D8 = D & ~7, d = 0;
    for (; d + 16 <= D8; d += 16) {
        __m256 a[4][2];
        for (int h = 0; h < NH; h++) a[h][0] = a[h][1] = _mm256_setzero_ps();
        for (int i = 0; i < nv; i++) {
            __m256 k0 = _mm256_loadu_ps(vr[i] + d), k1 = _mm256_loadu_ps(vr[i] + d + 8);
            for (int h = 0; h < NH; h++) {
                __m256 pv = _mm256_broadcast_ss(&pr[h]->pb[i]);
                a[h][0] = _mm256_fmadd_ps(pv, k0, a[h][0]);
                a[h][1] = _mm256_fmadd_ps(pv, k1, a[h][1]);
            }
        }
        for (int h = 0; h < NH; h++) {
            _mm256_storeu_ps(facc + (size_t)h * D + d, a[h][0]);
            _mm256_storeu_ps(facc + (size_t)h * D + d + 8, a[h][1]);
        }
    }
    for (; d < D8; d += 8) {
        __m256 a[4];
        for (int h = 0; h < NH; h++) a[h] = _mm256_setzero_ps();
        for (int i = 0; i < nv; i++) {
            __m256 k0 = _mm256_loadu_ps(vr[i] + d);
            for (int h = 0; h < NH; h++) a[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(&pr[h]->pb[i]), k0, a[h]);
        }
        for (int h = 0; h < NH; h++) _mm256_storeu_ps(facc + (size_t)h * D + d, a[h]);
    }
    for (; d < D; d++)
        for (int h = 0; h < NH; h++) {
            float v = 0.0f;
            for (int i = 0; i < nv; i++) v += pr[h]->pb[i] * vr[i][d];
            facc[(size_t)h * D + d] = v;
        }
}
static void sa_vals1(const float *const *vr, int nv, int D, const sa_probs_t *const *pr, float *facc) {
    sa_vals_k(vr, nv, D, 1, pr, facc);
}
static void sa_vals4(const float *const *vr, int nv, int D, const sa_probs_t *const *pr, float *facc) {
    sa_vals_k(vr, nv, D, 4, pr, facc);
}

static void sa_fold(const sa_probs_t *pr, int D, float *m_io, float *den_io, float *acc, const float *facc) {
    __m256 fv = _mm256_set1_ps(pr->f);
    int D8 = D & ~7;
    for (int d = 0; d < D8; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(acc + d), fv), _mm256_loadu_ps(facc + d)));
    for (int d = D8; d < D; d++) acc[d] = acc[d] * pr->f + facc[d];
    *den_io = *den_io * pr->f + pr->bsum;
    *m_io = pr->m_new;
}

/* Exact mode's block (double value sums in dacc), or fast mode's for one head. */
static void sa_block(const ds41_ctx *ctx, const float *qh, const float *const *rows, int n, int D, float scale,
                     float *m_io, float *den_io, float *acc, double *dacc, const float *dots) {
    sa_probs_t pr;
    sa_probs(ctx, qh, rows, n, D, scale, *m_io, dots, &pr);
    const float *vr[SA_BLOCK];
    int nv = 0;
    for (int i = 0; i < n; i++)
        if (rows[i]) vr[nv++] = rows[i];
    if (ctx->exact) {
        for (int d = 0; d < D; d++) dacc[d] = 0.0;
        for (int i = 0; i < nv; i++) {
            double pb = pr.pb[i];
            for (int d = 0; d < D; d++) dacc[d] += pb * (double)vr[i][d];
        }
        for (int d = 0; d < D; d++) acc[d] = acc[d] * pr.f + (float)dacc[d];
        *den_io = *den_io * pr.f + pr.bsum;
        *m_io = pr.m_new;
        return;
    }
    const sa_probs_t *pp = &pr;
    sa_vals1(vr, nv, D, &pp, (float *)dacc);
    sa_fold(&pr, D, m_io, den_io, acc, (const float *)dacc);
}

/* Query row t, heads [h0, h1): each block's rows are fetched (P2: decoded) once and applied to
 * every head of the range, in fast mode four heads' scores at a time off one load of each row.
 * With h1 = h0 + 1 this is the per-head loop (P3 off). The arithmetic of each head is the same
 * sequence of operations either way. */
static void sa_heads(const sa_job *j, int t, int h0, int h1, float *tile, double *dacc, float *acc, float *m,
                     float *den) {
    const ds41_ctx *ctx = j->ctx;
    int D = j->D, L = j->L, nh = h1 - h0;
    const int32_t *idx = j->idx + (size_t)t * L;
    const float *rows[SA_BLOCK];
    float dots[4][SA_BLOCK], d4[4];
    for (int k = 0; k < nh; k++) {
        m[k] = -1e30f;
        den[k] = 0.0f;
        for (int d = 0; d < D; d++) acc[(size_t)k * D + d] = 0.0f;
    }
    for (int b0 = 0; b0 < L; b0 += SA_BLOCK) {
        int n = L - b0 < SA_BLOCK ? L - b0 : SA_BLOCK;
        sa_rows(j, idx + b0, n, tile, rows);
        int k = 0;
        if (!ctx->exact)
            for (; k + 4 <= nh; k += 4) {
                const float *q4 = j->q + ((size_t)t * j->H + h0 + k) * D;
                const float *vr[SA_BLOCK];
                int nv = 0;
                for (int i = 0; i < n; i++) {
                    if (!rows[i]) continue;
                    vr[nv++] = rows[i];
                    if (j->zmm) ds41_sa_dot4_avx512(q4, (size_t)D, rows[i], D, d4);
                    else dot_v4(q4, (size_t)D, rows[i], D, d4);
                    for (int c = 0; c < 4; c++) dots[c][i] = d4[c];
                }
                sa_probs_t pr[4];
                const sa_probs_t *pp[4];
                for (int c = 0; c < 4; c++) {
                    sa_probs(ctx, q4 + (size_t)c * D, rows, n, D, j->scale, m[k + c], dots[c], &pr[c]);
                    pp[c] = &pr[c];
                }
                float *facc = (float *)dacc;   /* 4 D floats */
                if (j->zmm) {
                    const float *pb[4] = { pr[0].pb, pr[1].pb, pr[2].pb, pr[3].pb };
                    ds41_sa_vals4_avx512(vr, nv, D, pb, facc);
                } else {
                    sa_vals4(vr, nv, D, pp, facc);
                }
                for (int c = 0; c < 4; c++)
                    sa_fold(&pr[c], D, &m[k + c], &den[k + c], acc + (size_t)(k + c) * D, facc + (size_t)c * D);
            }
        for (; k < nh; k++)
            sa_block(ctx, j->q + ((size_t)t * j->H + h0 + k) * D, rows, n, D, j->scale, &m[k], &den[k],
                     acc + (size_t)k * D, dacc, NULL);
    }
    for (int k = 0; k < nh; k++) {
        float dn = den[k] + ds41_expf_x(ctx, j->sink[h0 + k] - m[k]);
        float *o = j->out + ((size_t)t * j->H + h0 + k) * D;
        for (int d = 0; d < D; d++) o[d] = bf16r(acc[(size_t)k * D + d] / dn);
    }
}

static void sa_range(void *arg, int i0, int i1) {
    const sa_job *j = arg;
    int D = j->D;
    float *tile = xmalloc((size_t)SA_BLOCK * D * sizeof(float));
    double *dacc = xmalloc((size_t)D * 2 * sizeof(double));   /* D doubles (exact) or 4 D floats (fast) */
    float *acc = xmalloc((size_t)j->hc * D * sizeof(float));
    float *m = xmalloc((size_t)j->hc * 2 * sizeof(float));
    for (int i = i0; i < i1; i++) {
        int t = i / j->nch, c = i % j->nch;
        int h0 = c * j->hc, h1 = h0 + j->hc < j->H ? h0 + j->hc : j->H;
        sa_heads(j, t, h0, h1, tile, dacc, acc, m, m + j->hc);
    }
    free(m);
    free(acc);
    free(dacc);
    free(tile);
}

void ds41_sparse_attn(const ds41_ctx *ctx, int n_heads, int head_dim, const float *q, int T,
                      const ds41_kvset *kv, const int32_t *idx, int L, const float *sink,
                      float scale, float *out) {
    pthread_once(&q4nv_once, q4nv_tab_init);
    sa_job j = { .ctx = ctx, .zmm = !ctx->exact && !strcmp(ds41_kernels_isa(), "avx512"), .H = n_heads,
                 .D = head_dim, .T = T, .L = L, .q = q, .sink = sink, .kv = kv, .idx = idx, .scale = scale,
                 .out = out, .hc = 1, .nch = n_heads };
    if (!(ctx->ablate & DS41_ABLATE_P3)) {
        /* P3: one KV head serves every query head; split the heads only as far as the threads
         * need work (a decode row on n threads: n head ranges) */
        int nt = ctx->pool ? ctx->n_threads : 1;
        int parts = T >= nt ? 1 : (nt + T - 1) / T;
        if (parts > n_heads) parts = n_heads;
        j.hc = (n_heads + parts - 1) / parts;
        j.nch = (n_heads + j.hc - 1) / j.hc;
    }
    int n = T * j.nch;
    if (ctx->prof) {
        /* bytes of KV rows fetched: each listed row once per item that reads it (P3 on: once
         * per head range, off: once per head), a packed record or a float row */
        double by = 0.0;
        for (size_t i = 0; i < (size_t)T * L; i++) {
            int r = idx[i];
            for (int p = 0; r >= 0 && p < DS41_KVSET_PARTS; p++) {
                if (r < kv->n[p]) { by += kv->rec[p] ? head_dim / 2 + head_dim / 16 : head_dim * 4; break; }
                r -= kv->n[p];
            }
        }
        ctx->prof[DS41_PROF_KVBYTES] += by * j.nch;
    }
    if (ctx->pool && n > 1) ds41_parallel_for(ctx, n, sa_range, &j);
    else sa_range(&j, 0, n);
}

/* ====================================================================== 3.13 output projection */

void ds41_attn_output(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                      const ds41_rope *rope, float *o, int T, const int *pos, float *scratch, float *y) {
    int H = cfg->n_heads, D = cfg->head_dim, rd = cfg->rope_dim;
    int G = cfg->o_groups, OL = cfg->o_lora_rank, hpg = H / G;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            ds41_rope_apply(rope, o + ((size_t)t * H + h) * D + (D - rd), pos[t], 1);
    for (int g = 0; g < G; g++)
        ds41_linear_fp8_dq(ctx, &lw->wo_a, g * OL, OL, o + (size_t)g * hpg * D, H * D, T,
                           scratch + (size_t)g * OL, G * OL);
    ds41_linear_fp8(ctx, &lw->wo_b, scratch, T, y);
}
