/* ds41 mHC (spec 3.4): the mixes with Sinkhorn, apply_pre, apply_post.
 *
 * Everything is per token, so threading over tokens cannot change a result. In exact mode
 * every reduction (the fn projection, the RMS mean, the Sinkhorn row and column sums, the
 * pre-mix and the C*R sums) is a double sum of the FP32 terms the reference materialises,
 * rounded once to FP32; all other operations are single FP32 operations in the order the
 * spec writes them. */
#include "mhc.h"
#include "formats.h"
#include "linear_fast.h"

#include <immintrin.h>
#include <stdlib.h>

#define HC_MAX 16   /* hc_mult bound (production 4); the config loader keeps it small */

typedef struct mix_job {
    const ds41_ctx *ctx;
    const ds41_config *cfg;
    const float *fn, *base, *scale, *X;
    float *pre, *post, *comb;
} mix_job;

/* sum of n FP32 terms: exact mode double -> FP32, fast mode FP32 left to right */
static inline float red(const ds41_ctx *ctx, const float *v, int n, int stride) {
    if (ctx->exact) {
        double s = 0.0;
        for (int i = 0; i < n; i++) s += (double)v[i * stride];
        return (float)s;
    }
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += v[i * stride];
    return s;
}

static void sinkhorn_split(const ds41_ctx *ctx, const ds41_config *cfg, const float *m, const float *base,
                           const float *scale, float *pre, float *post, float *C) {
    const int hc = cfg->hc_mult;
    const float eps = cfg->hc_eps;
    for (int i = 0; i < hc; i++) {
        pre[i] = ds41_sigmoid_x(ctx, m[i] * scale[0] + base[i]) + eps;
        post[i] = 2.0f * ds41_sigmoid_x(ctx, m[hc + i] * scale[1] + base[hc + i]);
    }
    for (int i = 0; i < hc * hc; i++) C[i] = m[2 * hc + i] * scale[2] + base[2 * hc + i];
    /* row "softmax" written out: exp per element (rounded), row sum, FP32 divide, + eps */
    for (int i = 0; i < hc; i++) {
        float *row = C + i * hc;
        float mx = row[0];
        for (int j = 1; j < hc; j++) mx = row[j] > mx ? row[j] : mx;
        for (int j = 0; j < hc; j++) row[j] = ds41_expf_x(ctx, row[j] - mx);
        float s = red(ctx, row, hc, 1);
        for (int j = 0; j < hc; j++) row[j] = row[j] / s + eps;
    }
    /* column normalisation: C[i][j] / (sum_i C[i][j] + eps) */
    float cs[HC_MAX];
    for (int j = 0; j < hc; j++) cs[j] = red(ctx, C + j, hc, hc) + eps;
    for (int i = 0; i < hc; i++)
        for (int j = 0; j < hc; j++) C[i * hc + j] = C[i * hc + j] / cs[j];
    for (int it = 0; it < cfg->hc_sinkhorn_iters - 1; it++) {
        for (int i = 0; i < hc; i++) {
            float rs = red(ctx, C + i * hc, hc, 1) + eps;
            for (int j = 0; j < hc; j++) C[i * hc + j] = C[i * hc + j] / rs;
        }
        for (int j = 0; j < hc; j++) cs[j] = red(ctx, C + j, hc, hc) + eps;
        for (int i = 0; i < hc; i++)
            for (int j = 0; j < hc; j++) C[i * hc + j] = C[i * hc + j] / cs[j];
    }
}

static void mix_tokens(void *arg, int t0, int t1) {
    const mix_job *j = arg;
    const ds41_ctx *ctx = j->ctx;
    const int hc = j->cfg->hc_mult, K = hc * j->cfg->dim, nmix = (2 + hc) * hc;
    float m[(2 + HC_MAX) * HC_MAX];
    for (int t = t0; t < t1; t++) {
        const float *x = j->X + (size_t)t * K;
        /* fp32(x @ fn^T) for the nmix rows, then one multiply by rsqrt(mean(x^2) + eps) */
        ds41_linear_f32(ctx, j->fn, nmix, K, x, 1, m);
        float mean;
        if (ctx->exact) {
            double s = 0.0;
            for (int k = 0; k < K; k++) s += (double)(x[k] * x[k]);
            mean = (float)(s / (double)K);
        } else {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s += x[k] * x[k];
            mean = s / (float)K;
        }
        float r = ds41_rsqrt_x(ctx, mean + j->cfg->norm_eps);
        for (int i = 0; i < nmix; i++) m[i] = m[i] * r;
        sinkhorn_split(ctx, j->cfg, m, j->base, j->scale, j->pre + (size_t)t * hc, j->post + (size_t)t * hc,
                       j->comb + (size_t)t * hc * hc);
    }
}

void ds41_hc_mixes(const ds41_ctx *ctx, const ds41_config *cfg, const float *fn, const float *base,
                   const float *scale, const float *X, int T, float *pre, float *post, float *comb) {
    if (cfg->hc_mult < 1 || cfg->hc_mult > HC_MAX || T <= 0) return;
    mix_job j = { ctx, cfg, fn, base, scale, X, pre, post, comb };
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_MHC, 0);
    /* The per-token projection runs on the calling thread (ds41_linear_f32 inside a pool job
     * is serial), so thread over tokens when there are several, else over the fn rows. */
    if (T > 1) ds41_parallel_for(ctx, T, mix_tokens, &j);
    else mix_tokens(&j, 0, 1);
    if (ctx->bd) ds41_bd_leave(ctx);
}

/* Fast mode, 8 elements d at a time: every lane runs the scalar code's FP32 operations in its
 * order (products, then the sum from +0 left to right, then the BF16 rounding), so the results
 * are the scalar ones bit for bit (tests/test_mhc.c); the scalar loops take the tail and exact
 * mode. Returns the first d not done. */
static int apply_pre_x8(const float *x, const float *w, int hc, int dim, float *y) {
    int d = 0;
    for (; d + 8 <= dim; d += 8) {
        __m256 s = _mm256_setzero_ps();
        for (int c = 0; c < hc; c++)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(w[c]), _mm256_loadu_ps(x + (size_t)c * dim + d)));
        _mm256_storeu_ps(y + d, ds41_bf16_round8(s));
    }
    return d;
}

static int apply_post_x8(const float *yt, const float *r, const float *C, float pj, int jc, int hc, int dim, float *o) {
    int d = 0;
    for (; d + 8 <= dim; d += 8) {
        __m256 s = _mm256_setzero_ps();
        for (int i = 0; i < hc; i++)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(C[i * hc + jc]), _mm256_loadu_ps(r + (size_t)i * dim + d)));
        __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(pj), _mm256_loadu_ps(yt + d)), s);
        _mm256_storeu_ps(o + d, ds41_bf16_round8(v));
    }
    return d;
}

void ds41_hc_apply_pre(const ds41_ctx *ctx, const float *X, const float *pre, int T, int hc, int dim, float *y) {
    if (hc < 1 || hc > HC_MAX) return;
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_MHC, 0);
    float p[HC_MAX];
    for (int t = 0; t < T; t++) {
        const float *x = X + (size_t)t * hc * dim;
        const float *w = pre + (size_t)t * hc;
        for (int d = ctx->exact ? 0 : apply_pre_x8(x, w, hc, dim, y + (size_t)t * dim); d < dim; d++) {
            for (int c = 0; c < hc; c++) p[c] = w[c] * x[(size_t)c * dim + d];
            y[(size_t)t * dim + d] = ds41_bf16_round(red(ctx, p, hc, 1));
        }
    }
    if (ctx->bd) ds41_bd_leave(ctx);
}

void ds41_hc_apply_post(const ds41_ctx *ctx, const float *y, const float *R, const float *post,
                        const float *comb, int T, int hc, int dim, float *out) {
    if (hc < 1 || hc > HC_MAX) return;
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_MHC, 0);
    float p[HC_MAX];
    for (int t = 0; t < T; t++) {
        const float *r = R + (size_t)t * hc * dim;
        const float *C = comb + (size_t)t * hc * hc;
        const float *yt = y + (size_t)t * dim;
        float *o = out + (size_t)t * hc * dim;
        for (int jc = 0; jc < hc; jc++) {
            float pj = post[(size_t)t * hc + jc];
            for (int d = ctx->exact ? 0 : apply_post_x8(yt, r, C, pj, jc, hc, dim, o + (size_t)jc * dim); d < dim; d++) {
                for (int i = 0; i < hc; i++) p[i] = C[i * hc + jc] * r[(size_t)i * dim + d];
                /* the post term is a separate FP32 addition after the C*R reduction */
                o[(size_t)jc * dim + d] = ds41_bf16_round(pj * yt[d] + red(ctx, p, hc, 1));
            }
        }
    }
    if (ctx->bd) ds41_bd_leave(ctx);
}
