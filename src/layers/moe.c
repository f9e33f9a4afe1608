/* ds41 MoE (spec 3.14): router, routed FP4 experts, shared FP8 expert.
 *
 * Router per token: FP32 logits from the BF16 gate weights (exact mode: double sums), divided
 * by gate_temp; scores sqrt(softplus(logit)) (or sigmoid / softmax when the config says so);
 * selection = the n_active largest fp32(score + bias) (bias_vl for image tokens), equal values
 * to the lower expert id; weights = the unbiased scores of the selection, renormalised with
 * eps 1e-20 when norm_topk_prob and n_active > 1, times route_scale.
 * Experts run over the tokens routed to them (gathered rows, so each weight row is decoded
 * once per forward); outputs are added into an FP32 accumulator per token in ascending expert
 * id, then the shared expert's output, then one BF16 rounding. The routed experts go through
 * a dispatch (moe.h): here in one process, at their owners across MPI ranks (src/dist/), with
 * the shared expert computed while they are away. */
#include "moe.h"
#include "formats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* a ranks before b: larger value first, equal values to the lower id */
static inline int ranks_before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

/* Indices of the k best of v[n] by the rule above, in rank order (insertion into a small
 * sorted list: k is at most a few dozen). The caller maps NaN to -inf first. */
static void topk_small(const float *v, int n, int k, int *out) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m == k && !ranks_before(v[i], i, v[out[k - 1]], out[k - 1])) continue;
        int p = m < k ? m++ : k - 1;
        while (p > 0 && ranks_before(v[i], i, v[out[p - 1]], out[p - 1])) {
            out[p] = out[p - 1];
            p--;
        }
        out[p] = i;
    }
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* SwiGLU with the clamps of 3.14: h[i] = w * fp32(silu(min(a, L)) * clamp(b, -L, L)),
 * rounded to BF16 (the input of w2, which quantizes it with Q8). */
static void swiglu(const ds41_ctx *ctx, float L, const float *a, const float *b, int n, const float *w,
                   int inter, float *h) {
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < inter; i++) {
            float av = a[(size_t)r * inter + i], bv = b[(size_t)r * inter + i];
            if (L > 0.0f) {
                bv = bv < -L ? -L : (bv > L ? L : bv);
                av = av > L ? L : av;
            }
            float u = ds41_silu_x(ctx, av) * bv;
            if (w) u = w[r] * u;
            h[(size_t)r * inter + i] = ds41_bf16_round(u);
        }
    }
}

/* Router for one token: sel[n_active] in rank order, wts[n_active] matching. */
static void route(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw, int E, int k,
                  const float *logit, int image, float *score, float *biased, int *sel, float *wts) {
    for (int e = 0; e < E; e++) {
        float l = logit[e] / cfg->gate_temp;
        if (!strcmp(cfg->score_func, "sigmoid")) score[e] = ds41_sigmoid_x(ctx, l);
        else if (!strcmp(cfg->score_func, "softmax")) score[e] = l;   /* normalised below */
        else score[e] = sqrtf(ds41_softplus_x(ctx, l));
    }
    if (!strcmp(cfg->score_func, "softmax")) {
        /* one softmax operation over the experts: in double, each weight rounded once */
        double mx = -INFINITY, s = 0.0;
        for (int e = 0; e < E; e++) mx = score[e] > mx ? score[e] : mx;
        for (int e = 0; e < E; e++) s += exp((double)score[e] - mx);
        for (int e = 0; e < E; e++) score[e] = (float)(exp((double)score[e] - mx) / s);
    }
    const float *bias = (image && lw->gate_bias_vl) ? lw->gate_bias_vl : lw->gate_bias;
    for (int e = 0; e < E; e++) {
        biased[e] = bias ? score[e] + bias[e] : score[e];
        if (biased[e] != biased[e]) biased[e] = -INFINITY;   /* a NaN score is never preferred */
    }
    topk_small(biased, E, k, sel);
    for (int i = 0; i < k; i++) wts[i] = score[sel[i]];
    if (cfg->norm_topk_prob && k > 1) {
        float s;
        if (ctx->exact) {
            double d = 0.0;
            for (int i = 0; i < k; i++) d += (double)wts[i];
            s = (float)d;
        } else {
            s = 0.0f;
            for (int i = 0; i < k; i++) s += wts[i];
        }
        s = s + 1e-20f;
        for (int i = 0; i < k; i++) wts[i] = wts[i] / s;
    }
    for (int i = 0; i < k; i++) wts[i] = wts[i] * cfg->route_scale;
}

int ds41_moe_experts(const ds41_ctx *ctx, const ds41_moe_rows *r, const uint8_t *own, float *acc, float *slots) {
    const ds41_config *cfg = r->cfg;
    const int dim = cfg->dim, inter = cfg->moe_inter_dim, T = r->T, k = r->k;
    int E = r->lw->n_experts;
    if (T <= 0 || k <= 0) return 0;
    int *count = calloc((size_t)(E > 0 ? E : 1), sizeof(int));
    int *rows = malloc((size_t)T * sizeof(int) * 2);
    float *rw = malloc((size_t)T * sizeof(float));
    float *xg = malloc((size_t)T * dim * sizeof(float));
    float *a = malloc((size_t)T * inter * sizeof(float));
    float *b = malloc((size_t)T * inter * sizeof(float));
    float *h = malloc((size_t)T * inter * sizeof(float));
    float *o = malloc((size_t)T * dim * sizeof(float));
    int rc = -1;
    if (!count || !rows || !rw || !xg || !a || !b || !h || !o) goto done;
    for (size_t i = 0; i < (size_t)T * k; i++)
        if (r->sel[i] >= 0 && r->sel[i] < E) count[r->sel[i]]++;
    /* ascending id: gather, w1 / w3, SwiGLU with weight, w2, add (or park in the row's slot) */
    int *slot = rows + T;
    for (int e = 0; e < E; e++) {
        if (!count[e] || (own && !own[e])) continue;
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < k; i++)
                if (r->sel[(size_t)t * k + i] == e) {
                    rows[n] = t;
                    slot[n] = t * k + i;
                    rw[n] = r->wts[(size_t)t * k + i];
                    memcpy(xg + (size_t)n * dim, r->x + (size_t)t * dim, (size_t)dim * sizeof(float));
                    n++;
                }
        const ds41_expert *ex = &r->lw->experts[e];
        ds41_linear_fp4(ctx, &ex->w1, xg, n, a);
        ds41_linear_fp4(ctx, &ex->w3, xg, n, b);
        swiglu(ctx, cfg->swiglu_limit, a, b, n, rw, inter, h);
        ds41_linear_fp4(ctx, &ex->w2, h, n, o);
        for (int q = 0; q < n; q++) {
            const float *orow = o + (size_t)q * dim;
            if (slots) {
                memcpy(slots + (size_t)slot[q] * dim, orow, (size_t)dim * sizeof(float));
            } else {
                float *ar = acc + (size_t)rows[q] * dim;
                for (int d = 0; d < dim; d++) ar[d] += orow[d];
            }
        }
    }
    rc = 0;
done:
    free(count); free(rows); free(rw); free(xg); free(a); free(b); free(h); free(o);
    return rc;
}

static void local_begin(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r) {
    (void)self; (void)ctx; (void)r;
}

/* Out of memory leaves acc without the routed outputs, as the MoE sublayer always did. */
static void local_end(void *self, const ds41_ctx *ctx, const ds41_moe_rows *r, float *acc) {
    (void)self;
    ds41_moe_experts(ctx, r, NULL, acc, NULL);
}

const ds41_moe_dispatch ds41_moe_local = { NULL, local_begin, local_end };

void ds41_moe(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
              const ds41_layer_plan *lp, const float *x, int T, const uint8_t *is_image,
              float *y, int *sel_out) {
    const int dim = cfg->dim, inter = cfg->moe_inter_dim;
    int E = lp->n_experts, k = lp->n_active;
    if (E > lw->n_experts) E = lw->n_experts;
    if (k > E) k = E;
    if (T <= 0) return;
    const ds41_moe_dispatch *dp = ctx->moe ? ctx->moe : &ds41_moe_local;
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_MOE, 0);
    float *acc = calloc((size_t)T * dim, sizeof(float));
    float *logits = malloc((size_t)T * (E > 0 ? E : 1) * sizeof(float));
    float *score = malloc((size_t)(E > 0 ? E : 1) * sizeof(float) * 2);
    int *sel = malloc((size_t)T * (k > 0 ? k : 1) * sizeof(int));
    float *wts = malloc((size_t)T * (k > 0 ? k : 1) * sizeof(float));
    float *a = malloc((size_t)T * inter * sizeof(float));
    float *b = malloc((size_t)T * inter * sizeof(float));
    float *h = malloc((size_t)T * inter * sizeof(float));
    float *o = malloc((size_t)T * dim * sizeof(float));
    if (!acc || !logits || !score || !sel || !wts || !a || !b || !h || !o) goto done;

    /* ---- router: FP32 linear over the BF16 gate weights (every process: replicated) */
    int routed = E > 0 && k > 0;
    if (routed) {
        if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_ROUTER, 0);
        ds41_bf16w g = lw->gate;
        g.out = E;
        ds41_linear_bf16(ctx, &g, x, T, logits, 0);
        for (int t = 0; t < T; t++) {
            route(ctx, cfg, lw, E, k, logits + (size_t)t * E, is_image ? is_image[t] : 0, score, score + E,
                  sel + (size_t)t * k, wts + (size_t)t * k);
            if (sel_out) {
                memcpy(sel_out + (size_t)t * k, sel + (size_t)t * k, (size_t)k * sizeof(int));
                qsort(sel_out + (size_t)t * k, (size_t)k, sizeof(int), cmp_int);
            }
        }
        if (ctx->bd) ds41_bd_leave(ctx);
    }
    ds41_moe_rows rr = { cfg, lw, x, T, k, sel, wts };
    if (routed) dp->begin(dp->self, ctx, &rr);

    /* ---- shared expert (FP8 linears, same SwiGLU, no routing weight), while the routed rows
     * are away: its output waits in o and is added after them, as one process adds it */
    int shared = cfg->n_shared_experts > 0 && lw->sh_w1.w;
    if (shared) {
        ds41_linear_fp8(ctx, &lw->sh_w1, x, T, a);
        ds41_linear_fp8(ctx, &lw->sh_w3, x, T, b);
        swiglu(ctx, cfg->swiglu_limit, a, b, T, NULL, inter, h);
        ds41_linear_fp8(ctx, &lw->sh_w2, h, T, o);
    }
    /* ---- routed outputs into acc in ascending expert id, then the shared expert's */
    if (routed) dp->end(dp->self, ctx, &rr, acc);
    if (shared)
        for (size_t i = 0; i < (size_t)T * dim; i++) acc[i] += o[i];
    for (size_t i = 0; i < (size_t)T * dim; i++) y[i] = ds41_bf16_round(acc[i]);

done:
    free(acc); free(logits); free(score); free(sel); free(wts); free(a); free(b); free(h); free(o);
    if (ctx->bd) ds41_bd_leave(ctx);
}
