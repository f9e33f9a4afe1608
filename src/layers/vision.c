/* ds41 vision tower and aligner (vision.h, docs/vision.md). Arithmetic per exact-mode.md and
 * the vision rules of docs/vision.md:
 *   linear + bias   y = bf16(fp32(dot) + bias)       (dot: ds41_linear_bf16, FP32 result)
 *   RMSNorm         ds41_rmsnorm with eps fp32(1e-6)
 *   2D rotary       half split; table entries j < rd/2 at the patch row, the rest at its column
 *   attention       per head, 64-query x 64-key tiles, the block recurrence of spec 3.12
 *                   without a sink; BF16 probabilities in the P.V product
 *   MLP             bf16(bf16(silu(gate)) * up), no biases
 *   aligner         zero-padded r x r unshuffle, linear + bias, exact-erf GELU, linear + bias */
#include "vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats.h"

#define VIS_EPS 1e-6f
#define TILE 64

int ds41_vision_grid(const ds41_vision *v, int H, int W, int *n_h, int *n_w, int *gh, int *gw, ds41_err *err) {
    int p = v->patch, r = v->ratio;
    if (H <= 0 || W <= 0 || H > DS41_VISION_MAX_SIDE || W > DS41_VISION_MAX_SIDE)
        return ds41_errf(err, "image %d x %d pixels: each side must be 1 .. %d", W, H, DS41_VISION_MAX_SIDE);
    if (H % p || W % p)
        return ds41_errf(err, "image %d x %d pixels: width and height must be multiples of the patch size %d", W,
                         H, p);
    *n_h = H / p;
    *n_w = W / p;
    *gh = (*n_h + r - 1) / r;
    *gw = (*n_w + r - 1) / r;
    return 0;
}

/* y [T, out] = bf16(fp32(x . w) + bias) */
static void linear_bias(const ds41_ctx *ctx, const ds41_bf16w *w, const uint16_t *bias, const float *x, int T,
                        float *y) {
    ds41_linear_bf16(ctx, w, x, T, y, 0);
    for (int t = 0; t < T; t++) {
        float *yr = y + (size_t)t * w->out;
        for (int o = 0; o < w->out; o++) yr[o] = ds41_bf16_round(yr[o] + ds41_bf16_to_f32(bias[o]));
    }
}

/* x [T, n] += y, rounded to BF16 (the residual add) */
static void residual(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = ds41_bf16_round(x[i] + y[i]);
}

static float gelu_x(const ds41_ctx *ctx, float x) {
    if (!ctx->exact) return 0.5f * x * (1.0f + erff(x * 0.70710678f));
    double xd = (double)x;
    return (float)(0.5 * xd * (1.0 + erf(xd * (1.0 / sqrt(2.0)))));
}

/* ---- 2D rotary ---------------------------------------------------------------------------- */

/* cos / sin [n_h * n_w, rd]: entries j < rd/2 at the patch row, the others at its column. */
static int vision_tables(const ds41_vision *v, int n_h, int n_w, float **cs, float **sn, ds41_err *err) {
    int rd = v->head_dim / 2, half = rd / 2;
    ds41_config c;
    memset(&c, 0, sizeof c);
    c.rope_dim = rd;
    ds41_rope r;
    int maxp = n_h > n_w ? n_h : n_w;
    if (ds41_rope_init(&r, &c, v->theta, 0, maxp, err)) return -1;
    size_t n = (size_t)n_h * n_w;
    *cs = malloc(n * rd * sizeof(float));
    *sn = malloc(n * rd * sizeof(float));
    if (!*cs || !*sn) {
        ds41_rope_free(&r);
        return ds41_errf(err, "out of memory for the vision rotary tables (%zu patches)", n);
    }
    for (int h = 0; h < n_h; h++)
        for (int w = 0; w < n_w; w++) {
            size_t t = (size_t)h * n_w + w;
            for (int j = 0; j < half; j++) {
                (*cs)[t * rd + j] = r.cos[(size_t)h * half + j];
                (*sn)[t * rd + j] = r.sin[(size_t)h * half + j];
                (*cs)[t * rd + half + j] = r.cos[(size_t)w * half + j];
                (*sn)[t * rd + half + j] = r.sin[(size_t)w * half + j];
            }
        }
    ds41_rope_free(&r);
    return 0;
}

/* one head vector x[0 .. 2 rd): element i pairs with i + rd */
static void rotate_half(float *x, const float *c, const float *s, int rd) {
    for (int i = 0; i < rd; i++) {
        float a = x[i], b = x[i + rd];
        float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
        x[i] = ds41_bf16_round(ac - bs);
        x[i + rd] = ds41_bf16_round(bc + as);
    }
}

/* ---- attention: 64 x 64 tiles, online softmax --------------------------------------------- */

/* fast mode's q.k: eight partial sums (vectorisable), n a multiple of 4 */
static float dot_fast(const float *a, const float *b, int n) {
    float acc[8] = { 0 };
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[d + l] * b[d + l];
    for (; d < n; d++) acc[0] += a[d] * b[d];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

typedef struct att_job {
    const ds41_ctx *ctx;
    const float *q, *k, *v;     /* [n, D], head h at h * hd */
    float *o;
    int n, D, H, hd, nqb;
    float scale;
} att_job;

static void att_tiles(void *arg, int i0, int i1) {
    const att_job *j = arg;
    const int hd = j->hd, D = j->D, exact = j->ctx->exact;
    float *m = malloc(sizeof(float) * TILE * (3 + 2 * TILE + 2 * (size_t)hd));
    double *pvd = malloc(sizeof(double) * (size_t)hd);
    if (!m || !pvd) {
        free(m);
        free(pvd);
        return;
    }
    float *den = m + TILE, *f = den + TILE, *s = f + TILE, *pb = s + TILE * TILE, *acc = pb + TILE * TILE,
          *pv = acc + (size_t)TILE * hd;
    for (int task = i0; task < i1; task++) {
        int h = task / j->nqb, q0 = (task % j->nqb) * TILE;
        int nq = j->n - q0 < TILE ? j->n - q0 : TILE;
        for (int a = 0; a < nq; a++) {
            m[a] = -1e30f;
            den[a] = 0.0f;
        }
        memset(acc, 0, sizeof(float) * (size_t)nq * hd);
        for (int k0 = 0; k0 < j->n; k0 += TILE) {
            int nk = j->n - k0 < TILE ? j->n - k0 : TILE;
            for (int a = 0; a < nq; a++) {
                const float *qa = j->q + (size_t)(q0 + a) * D + (size_t)h * hd;
                float mx = m[a];
                for (int b = 0; b < nk; b++) {
                    const float *kb = j->k + (size_t)(k0 + b) * D + (size_t)h * hd;
                    float dot;
                    if (exact) {
                        double acc_d = 0.0;
                        for (int d = 0; d < hd; d++) acc_d += (double)qa[d] * (double)kb[d];
                        dot = (float)acc_d;
                    } else {
                        dot = dot_fast(qa, kb, hd);
                    }
                    float sc = dot * j->scale;
                    s[a * TILE + b] = sc;
                    if (sc > mx) mx = sc;
                }
                f[a] = ds41_expf_x(j->ctx, m[a] - mx);
                double sum_d = 0.0;
                float sum_f = 0.0f;
                for (int b = 0; b < nk; b++) {
                    float p = ds41_expf_x(j->ctx, s[a * TILE + b] - mx);
                    if (exact) sum_d += (double)p;
                    else sum_f += p;
                    pb[a * TILE + b] = ds41_bf16_round(p);
                }
                den[a] = den[a] * f[a] + (exact ? (float)sum_d : sum_f);
                m[a] = mx;
            }
            for (int a = 0; a < nq; a++) {
                /* P.V: each output element sums over the block's keys in key order (rows of V
                 * read contiguously) */
                if (exact) {
                    for (int d = 0; d < hd; d++) pvd[d] = 0.0;
                    for (int b = 0; b < nk; b++) {
                        const float *vr = j->v + (size_t)(k0 + b) * D + (size_t)h * hd;
                        double p = (double)pb[a * TILE + b];
                        for (int d = 0; d < hd; d++) pvd[d] += p * (double)vr[d];
                    }
                    for (int d = 0; d < hd; d++) pv[d] = (float)pvd[d];
                } else {
                    for (int d = 0; d < hd; d++) pv[d] = 0.0f;
                    for (int b = 0; b < nk; b++) {
                        const float *vr = j->v + (size_t)(k0 + b) * D + (size_t)h * hd;
                        float p = pb[a * TILE + b];
                        for (int d = 0; d < hd; d++) pv[d] += p * vr[d];
                    }
                }
                float *ac = acc + (size_t)a * hd;
                for (int d = 0; d < hd; d++) ac[d] = ac[d] * f[a] + pv[d];
            }
        }
        for (int a = 0; a < nq; a++) {
            float *oa = j->o + (size_t)(q0 + a) * D + (size_t)h * hd;
            for (int d = 0; d < hd; d++) oa[d] = ds41_bf16_round(acc[(size_t)a * hd + d] / den[a]);
        }
    }
    free(m);
    free(pvd);
}

/* ---- the tower ---------------------------------------------------------------------------- */

int ds41_vision_tower(const ds41_ctx *ctx, const ds41_vision *v, const float *pixels, int H, int W, float *feat,
                      ds41_err *err) {
    int n_h, n_w, gh, gw;
    if (!v->blocks) return ds41_errf(err, "the checkpoint has no vision tower");
    if (ds41_vision_grid(v, H, W, &n_h, &n_w, &gh, &gw, err)) return -1;
    const int p = v->patch, D = v->dim, I = v->inter, hd = v->head_dim, rd = hd / 2, nh = v->n_heads;
    const int n = n_h * n_w, K = 3 * p * p;
    float *cs = NULL, *sn = NULL, *patches = NULL, *a = NULL, *qkv = NULL, *q = NULL, *o = NULL;
    int rc = -1;
    if (vision_tables(v, n_h, n_w, &cs, &sn, err)) goto out;
    size_t big = (size_t)n * (size_t)(K > 2 * I ? K : 2 * I);
    patches = malloc(big * sizeof(float));
    a = malloc((size_t)n * D * sizeof(float));
    qkv = malloc((size_t)n * 3 * D * sizeof(float));
    q = malloc((size_t)n * 3 * D * sizeof(float));
    o = malloc((size_t)n * D * sizeof(float));
    if (!patches || !a || !qkv || !q || !o) {
        ds41_errf(err, "out of memory for the vision tower (%d patches)", n);
        goto out;
    }
    float *k = q + (size_t)n * D, *vv = k + (size_t)n * D;
    /* patch vectors: channel, row, column inside the patch; patches in reading order */
    for (int ph = 0; ph < n_h; ph++)
        for (int pw = 0; pw < n_w; pw++) {
            float *dst = patches + ((size_t)ph * n_w + pw) * K;
            for (int c = 0; c < 3; c++)
                for (int y = 0; y < p; y++)
                    memcpy(dst + (size_t)(c * p + y) * p, pixels + ((size_t)c * H + (size_t)ph * p + y) * W + (size_t)pw * p,
                           (size_t)p * sizeof(float));
        }
    linear_bias(ctx, &v->patch_w, v->patch_b, patches, n, feat);
    att_job aj = { ctx, q, k, vv, o, n, D, nh, hd, (n + TILE - 1) / TILE, (float)pow((double)hd, -0.5) };
    for (int b = 0; b < v->n_layers; b++) {
        const ds41_vision_block *B = &v->blocks[b];
        ds41_rmsnorm(ctx, feat, B->norm1, n, D, VIS_EPS, a);
        linear_bias(ctx, &B->wqkv, B->bqkv, a, n, qkv);
        for (int t = 0; t < n; t++) {
            const float *row = qkv + (size_t)t * 3 * D;
            memcpy(q + (size_t)t * D, row, (size_t)D * sizeof(float));
            memcpy(k + (size_t)t * D, row + D, (size_t)D * sizeof(float));
            memcpy(vv + (size_t)t * D, row + 2 * D, (size_t)D * sizeof(float));
            for (int h = 0; h < nh; h++) {
                rotate_half(q + (size_t)t * D + (size_t)h * hd, cs + (size_t)t * rd, sn + (size_t)t * rd, rd);
                rotate_half(k + (size_t)t * D + (size_t)h * hd, cs + (size_t)t * rd, sn + (size_t)t * rd, rd);
            }
        }
        ds41_parallel_for(ctx, nh * aj.nqb, att_tiles, &aj);
        linear_bias(ctx, &B->wo, B->bo, o, n, a);
        residual(feat, a, (size_t)n * D);
        ds41_rmsnorm(ctx, feat, B->norm2, n, D, VIS_EPS, a);
        ds41_linear_bf16(ctx, &B->w1, a, n, patches, 1);
        for (int t = 0; t < n; t++) {
            float *gu = patches + (size_t)t * 2 * I;
            for (int i = 0; i < I; i++) gu[i] = ds41_bf16_round(ds41_bf16_round(ds41_silu_x(ctx, gu[i])) * gu[I + i]);
            if (t) memmove(patches + (size_t)t * I, gu, (size_t)I * sizeof(float));   /* pack [n, I] */
        }
        ds41_linear_bf16(ctx, &B->w2, patches, n, a, 1);
        residual(feat, a, (size_t)n * D);
    }
    memcpy(a, feat, (size_t)n * D * sizeof(float));
    ds41_rmsnorm(ctx, a, v->norm, n, D, VIS_EPS, feat);
    rc = 0;
out:
    free(patches);
    free(a);
    free(qkv);
    free(q);
    free(o);
    free(cs);
    free(sn);
    return rc;
}

/* ---- the aligner -------------------------------------------------------------------------- */

int ds41_vision_encode(const ds41_ctx *ctx, const ds41_vision *v, const float *pixels, int H, int W, float *out,
                       ds41_err *err) {
    int n_h, n_w, gh, gw;
    if (!v->blocks) return ds41_errf(err, "the checkpoint has no vision tower");
    if (ds41_vision_grid(v, H, W, &n_h, &n_w, &gh, &gw, err)) return -1;
    const int D = v->dim, r = v->ratio, d = v->lm_dim, ntok = gh * gw;
    const size_t K = (size_t)D * r * r;
    float *feat = malloc((size_t)n_h * n_w * D * sizeof(float));
    float *u = calloc((size_t)ntok * K, sizeof(float));
    float *h = malloc((size_t)ntok * d * sizeof(float));
    int rc = -1;
    if (!feat || !u || !h) {
        ds41_errf(err, "out of memory for the aligner (%d tokens)", ntok);
        goto out;
    }
    if (ds41_vision_tower(ctx, v, pixels, H, W, feat, err)) goto out;
    /* token (i, j), feature c r r + ky r + kx = patch (i r + ky, j r + kx), channel c; zero
     * where the padded grid has no patch */
    for (int i = 0; i < gh; i++)
        for (int j = 0; j < gw; j++) {
            float *dst = u + ((size_t)i * gw + j) * K;
            for (int ky = 0; ky < r; ky++)
                for (int kx = 0; kx < r; kx++) {
                    int y = i * r + ky, x = j * r + kx;
                    if (y >= n_h || x >= n_w) continue;
                    const float *src = feat + ((size_t)y * n_w + x) * D;
                    for (int c = 0; c < D; c++) dst[(size_t)c * r * r + ky * r + kx] = src[c];
                }
        }
    linear_bias(ctx, &v->al_w1, v->al_b1, u, ntok, h);
    for (size_t i = 0; i < (size_t)ntok * d; i++) h[i] = ds41_bf16_round(gelu_x(ctx, h[i]));
    linear_bias(ctx, &v->al_w2, v->al_b2, h, ntok, out);
    rc = 0;
out:
    free(feat);
    free(u);
    free(h);
    return rc;
}

int ds41_vision_span(const ds41_ctx *ctx, const ds41_vision *v, const float *pixels, int H, int W, float *out,
                     ds41_err *err) {
    int n_h, n_w, gh, gw;
    if (!v->blocks) return ds41_errf(err, "the checkpoint has no vision tower");
    if (ds41_vision_grid(v, H, W, &n_h, &n_w, &gh, &gw, err)) return -1;
    const int d = v->lm_dim;
    float *emb = malloc((size_t)gh * gw * d * sizeof(float));
    if (!emb) return ds41_errf(err, "out of memory for %d image tokens", gh * gw);
    if (ds41_vision_encode(ctx, v, pixels, H, W, emb, err)) {
        free(emb);
        return -1;
    }
    size_t row = 0;
#define PUT_VEC(src)                                                                     \
    do {                                                                                 \
        for (int c = 0; c < d; c++) out[row * d + c] = ds41_bf16_to_f32((src)[c]);      \
        row++;                                                                           \
    } while (0)
    PUT_VEC(v->image_start);
    for (int i = 0; i < gh; i++) {
        memcpy(out + row * d, emb + (size_t)i * gw * d, (size_t)gw * d * sizeof(float));
        row += gw;
        PUT_VEC(v->image_newline);
    }
    PUT_VEC(v->image_end);
#undef PUT_VEC
    free(emb);
    return 0;
}
