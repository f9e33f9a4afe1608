/* ds41 DSpark draft forward (spec 5.1-5.2). See dspark.h for how it plugs into the target
 * forward. Every stage is a normal V4.1 block (delayed mHC pre, MoE with the plan's expert
 * counts) whose attention is SWA-only and special: the KV list is the stage's context ring
 * in slot order followed by the block's own keys, identical for every block query
 * (non-causal inside the block), all through the attention.h pieces, so exact and fast mode
 * follow ctx->exact like the rest of the forward. */
#include "dspark.h"
#include "attention.h"
#include "formats.h"
#include "mhc.h"
#include "dist_pipe.h"

#include <stdlib.h>
#include <string.h>

#define DS41_DSPARK_CTX_STACK 8192   /* dims up to this project the context row on the stack */

static int check_model(const ds41_engine *e, ds41_err *err) {
    const ds41_config *cfg = e->cfg;
    if (cfg->n_mtp < 1 || cfg->dspark_block_size < 1)
        return ds41_errf(err, "dspark: the config has no DSpark stages (num_nextn_predict_layers %d, "
                         "dspark_block_size %d)", cfg->n_mtp, cfg->dspark_block_size);
    if (cfg->dspark_block_size > DS41_DSPARK_MAX_BLOCK)
        return ds41_errf(err, "dspark: dspark_block_size %d exceeds the supported %d", cfg->dspark_block_size,
                         DS41_DSPARK_MAX_BLOCK);
    if (cfg->n_dspark_targets < 1) return ds41_errf(err, "dspark: dspark_target_layer_ids is empty");
    if (!e->w || e->w->n_layers < cfg->n_layers + cfg->n_mtp || !e->w->layers)
        return ds41_errf(err, "dspark: the weights hold no DSpark stages");
    const ds41_layer_weights *s0 = &e->w->layers[cfg->n_layers];
    const ds41_layer_weights *sl = &e->w->layers[cfg->n_layers + cfg->n_mtp - 1];
    if (!s0->main_proj.w || !s0->main_norm) return ds41_errf(err, "dspark: mtp.0.main_proj / main_norm not bound");
    if (s0->main_proj.in != cfg->n_dspark_targets * cfg->dim || s0->main_proj.out != cfg->dim)
        return ds41_errf(err, "dspark: mtp.0.main_proj is [%d, %d], expected [%d, %d]", s0->main_proj.out,
                         s0->main_proj.in, cfg->dim, cfg->n_dspark_targets * cfg->dim);
    if (!sl->final_norm || !sl->markov_embed.w || !sl->markov_head.w || !sl->conf_proj.w)
        return ds41_errf(err, "dspark: mtp.%d norm / markov_head / confidence_head not bound", cfg->n_mtp - 1);
    if (sl->conf_proj.in != cfg->dim + cfg->dspark_markov_rank)
        return ds41_errf(err, "dspark: confidence_head.proj has %d inputs, expected %d", sl->conf_proj.in,
                         cfg->dim + cfg->dspark_markov_rank);
    return 0;
}

int ds41_dspark_context(const ds41_engine *e, const float *main_hidden, int n, float *ctx_rows, ds41_err *err) {
    if (check_model(e, err)) return -1;
    if (n <= 0) return 0;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_weights *s0 = &e->w->layers[cfg->n_layers];
    float *p = malloc((size_t)n * cfg->dim * sizeof(float));
    if (!p) return ds41_errf(err, "dspark: out of memory for %d context rows", n);
    ds41_linear_fp8(&e->ctx, &s0->main_proj, main_hidden, n, p);
    ds41_rmsnorm(&e->ctx, p, s0->main_norm, n, cfg->dim, cfg->norm_eps, ctx_rows);
    free(p);
    return 0;
}

/* One context row without allocating: main_proj into ctx_row, then the norm in place. */
static int ds41_dspark_context_into(const ds41_engine *e, const float *main_hidden_row, float *ctx_row, ds41_err *err) {
    const ds41_config *cfg = e->cfg;
    const ds41_layer_weights *s0 = &e->w->layers[cfg->n_layers];
    float tmp[DS41_DSPARK_CTX_STACK];
    if (cfg->dim > DS41_DSPARK_CTX_STACK) return ds41_dspark_context(e, main_hidden_row, 1, ctx_row, err);
    ds41_linear_fp8(&e->ctx, &s0->main_proj, main_hidden_row, 1, tmp);
    ds41_rmsnorm(&e->ctx, tmp, s0->main_norm, 1, cfg->dim, cfg->norm_eps, ctx_row);
    return 0;
}

/* Context keys of n context rows at positions pos0.. into the ring of stage s. */
static int write_ring(const ds41_engine *e, ds41_cache *c, int s, const float *cx, int n, long long pos0,
                      ds41_err *err) {
    const ds41_config *cfg = e->cfg;
    int l = cfg->n_layers + s;
    if (l >= c->n_rings) return ds41_errf(err, "dspark: the cache has no ring for stage %d", s);
    ds41_ring *ring = &c->rings[l];
    int rb = ds41_swa_rec_bytes(cfg);
    if (ring->rec_bytes != rb) return ds41_errf(err, "dspark: stage %d ring records are %d B, expected %d", s,
                                                ring->rec_bytes, rb);
    int *pos = malloc((size_t)n * sizeof(int));
    float *k = malloc((size_t)n * cfg->head_dim * sizeof(float));
    uint8_t *rec = malloc((size_t)n * rb);
    if (!pos || !k || !rec) {
        free(pos); free(k); free(rec);
        return ds41_errf(err, "dspark: out of memory");
    }
    for (int i = 0; i < n; i++) pos[i] = (int)(pos0 + i);
    ds41_attn_swa_k(&e->ctx, cfg, &e->w->layers[l], &e->ropes[e->layer_rope[l]], cx, n, pos, k, rec);
    for (int i = 0; i < n; i++) memcpy(ds41_ring_slot(ring, pos0 + i), rec + (size_t)i * rb, (size_t)rb);
    free(pos); free(k); free(rec);
    return 0;
}

int ds41_dspark_seed(const ds41_engine *e, ds41_cache *c, const float *main_hidden, int n, long long pos0,
                     ds41_err *err) {
    if (check_model(e, err)) return -1;
    const ds41_config *cfg = e->cfg;
    if (n <= 0) return 0;
    /* --split layers: the DSpark stages run on the last stage only (their rings are its) */
    if (e->pipe && !ds41_pipe_last(e->pipe)) return 0;
    if (pos0 < 0 || pos0 + n > e->max_pos)
        return ds41_errf(err, "dspark: context positions %lld..%lld outside the context of %lld", pos0,
                         pos0 + n - 1, e->max_pos);
    /* only the last `window` positions survive in a ring */
    int skip = n > cfg->window ? n - cfg->window : 0;
    main_hidden += (size_t)skip * cfg->n_dspark_targets * cfg->dim;
    n -= skip;
    pos0 += skip;
    /* the context rows go straight into the cache's P5 rows, which a proposal at one of these
     * positions reuses: grown to the largest seed (a window, when a dormant gate's deferred
     * rows are flushed), never shrunk, so a flush allocates nothing after the first */
    c->dctx.n = 0;
    if (c->dctx.cap < n) {
        float *r = realloc(c->dctx.rows, (size_t)n * cfg->dim * sizeof(float));
        if (!r) return ds41_errf(err, "dspark: out of memory for %d context rows", n);
        c->dctx.rows = r;
        c->dctx.cap = n;
    }
    float *cx = c->dctx.rows;
    const ds41_layer_weights *s0 = &e->w->layers[cfg->n_layers];
    ds41_linear_fp8(&e->ctx, &s0->main_proj, main_hidden, n, cx);
    /* the norm in place (each row's sum of squares is taken before the row is written) */
    ds41_rmsnorm(&e->ctx, cx, s0->main_norm, n, cfg->dim, cfg->norm_eps, cx);
    int rc = 0;
    for (int s = 0; s < cfg->n_mtp && !rc; s++) rc = write_ring(e, c, s, cx, n, pos0, err);
    if (!rc) {
        c->dctx.n = n;
        c->dctx.pos0 = pos0;
    }
    return rc;
}

/* The KV index list of a draft block, the same for every one of its B queries: ring slots
 * 0 .. nring-1 in slot order (not chronological), then the block's keys at KV rows W .. W+B-1. */
static void block_list(int32_t *list, int nring, int B, int W) {
    int L = nring + B;
    for (int i = 0; i < B; i++) {
        int32_t *li = list + (size_t)i * L;
        for (int j = 0; j < nring; j++) li[j] = j;
        for (int j = 0; j < B; j++) li[nring + j] = W + j;
    }
}

/* Scratch of one proposal, allocated once (ds41_dspark_work_new) and reused: no allocation per
 * call. The stages run on the whole block; the heads run lazily, one row when its draft is
 * asked for (ds41_dspark_next), so a step that verifies K drafts pays K head + Markov passes,
 * and the confidence of draft k (ds41_dspark_conf) needs only the drafts before it. */
struct ds41_dspark_work {
    int B, V, dim, rank;
    ds41_stream s;     /* the block's B rows */
    float *cx, *kctx, *cq, *q, *kv, *o, *wos, *base, *bias, *cin, *scratch;
    uint8_t *rec;
    int32_t *list;
    int *iscratch;
    /* the current proposal */
    int ready;                          /* ds41_dspark_begin succeeded */
    int made;                           /* drafts made: ids[0..made) */
    int32_t t_next;
    int32_t ids[DS41_DSPARK_MAX_BLOCK];
    float conf[DS41_DSPARK_MAX_BLOCK];
    unsigned char conf_ok[DS41_DSPARK_MAX_BLOCK];
    int conf_prev[DS41_DSPARK_MAX_BLOCK];   /* the previous token conf[k] was computed with */
};

static void *zalloc(size_t n, size_t sz, int *fail) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) *fail = 1;
    return p;
}

void ds41_dspark_work_free(ds41_dspark_work *b) {
    if (!b) return;
    ds41_stream_free(&b->s);
    float **f[] = { &b->cx, &b->kctx, &b->cq, &b->q, &b->kv, &b->o, &b->wos,
                    &b->base, &b->bias, &b->cin, &b->scratch };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(*f[i]);
    free(b->rec);
    free(b->list);
    free(b->iscratch);
    free(b);
}

ds41_dspark_work *ds41_dspark_work_new(const ds41_engine *e, ds41_err *err) {
    if (check_model(e, err)) return NULL;
    const ds41_config *cfg = e->cfg;
    const int B = cfg->dspark_block_size, dim = cfg->dim, W = cfg->window;
    const int D = cfg->head_dim, HD = cfg->n_heads * cfg->head_dim, V = cfg->vocab_size;
    ds41_dspark_work *b = calloc(1, sizeof *b);
    if (!b) { ds41_errf(err, "dspark: out of memory"); return NULL; }
    int fail = 0;
    size_t Bz = (size_t)B;
    b->B = B; b->V = V; b->dim = dim; b->rank = cfg->dspark_markov_rank;
    if (ds41_stream_alloc(&b->s, cfg, Bz)) fail = 1;
    b->cx = zalloc((size_t)dim, sizeof(float), &fail);
    b->kctx = zalloc((size_t)D, sizeof(float), &fail);
    b->rec = zalloc((size_t)ds41_swa_rec_bytes(cfg), 1, &fail);
    b->cq = zalloc(Bz * cfg->q_lora_rank, sizeof(float), &fail);
    b->q = zalloc(Bz * HD, sizeof(float), &fail);
    b->kv = zalloc(((size_t)W + Bz) * D, sizeof(float), &fail);
    b->o = zalloc(Bz * HD, sizeof(float), &fail);
    b->wos = zalloc(Bz * cfg->o_groups * cfg->o_lora_rank, sizeof(float), &fail);
    b->list = zalloc(Bz * ((size_t)W + Bz), sizeof(int32_t), &fail);
    b->base = zalloc((size_t)V, sizeof(float), &fail);
    b->bias = zalloc((size_t)V, sizeof(float), &fail);
    b->cin = zalloc((size_t)dim + b->rank, sizeof(float), &fail);
    b->scratch = zalloc((size_t)V, sizeof(float), &fail);
    b->iscratch = zalloc((size_t)V, sizeof(int), &fail);
    if (fail) {
        ds41_dspark_work_free(b);
        ds41_errf(err, "dspark: out of memory for a block of %d", B);
        return NULL;
    }
    return b;
}

int ds41_dspark_begin(const ds41_engine *e, ds41_cache *c, ds41_dspark_work *b, const float *main_hidden_row,
                      long long P, int32_t t_next, int reuse, ds41_err *err) {
    if (check_model(e, err)) return -1;
    const ds41_config *cfg = e->cfg;
    const ds41_weights *w = e->w;
    const ds41_ctx *ctx = &e->ctx;
    const int B = cfg->dspark_block_size, dim = cfg->dim, W = cfg->window;
    const int D = cfg->head_dim, V = cfg->vocab_size;
    b->ready = 0;
    b->made = 0;
    if (b->B != B || b->V != V || b->dim != dim) return ds41_errf(err, "dspark: the work buffer belongs to another model");
    if (P < 1) return ds41_errf(err, "dspark: a proposal needs P >= 1 (got %lld)", P);
    if (P >= e->max_pos) return ds41_errf(err, "dspark: position %lld outside the context of %lld", P, e->max_pos);
    if (t_next < 0 || t_next >= V) return ds41_errf(err, "dspark: token %d outside the vocabulary of %d", t_next, V);
    if (cfg->dspark_noise_token_id < 0 || cfg->dspark_noise_token_id >= V)
        return ds41_errf(err, "dspark: dspark_noise_token_id %d outside the vocabulary", cfg->dspark_noise_token_id);

    /* P5: the target side's seed already projected position P and wrote its context key
     * into every stage ring (the same bytes this call would write) */
    int reused = reuse && c->dctx.n > 0 && P >= c->dctx.pos0 && P < c->dctx.pos0 + c->dctx.n;
    int rc = 0;
    if (reused) memcpy(b->cx, c->dctx.rows + (size_t)(P - c->dctx.pos0) * dim, (size_t)dim * sizeof(float));
    else rc = ds41_dspark_context_into(e, main_hidden_row, b->cx, err);
    if (rc) return -1;

    /* block = [t_{P+1}, noise, ...] at positions P+1 .. P+B; 4 copies; pre one-hot copy 0 */
    int pos[DS41_DSPARK_MAX_BLOCK];
    for (int i = 0; i < B; i++) {
        pos[i] = (int)(P + 1 + i);
        ds41_stream_embed(cfg, w, &b->s, (size_t)i, i == 0 ? t_next : cfg->dspark_noise_token_id, NULL);
    }
    /* the index list, the same for every query: ring slots 0 .. min(W, P+1)-1 in slot order
     * (not chronological), then the block keys at KV rows W .. W+B-1 */
    int nring = P + 1 < W ? (int)(P + 1) : W, L = nring + B;
    block_list(b->list, nring, B, W);
    const float scale = ds41_attn_scale(cfg);
    int P32 = (int)P;

    for (int s = 0; s < cfg->n_mtp && !rc; s++) {
        int l = cfg->n_layers + s;
        const ds41_layer_weights *lw = &w->layers[l];
        const ds41_layer_plan *lp = &cfg->layers[l];
        const ds41_rope *rope = &e->ropes[e->layer_rope[l]];
        ds41_ring *ring = l < c->n_rings ? &c->rings[l] : NULL;
        if (!ring || ring->slots != W) {
            rc = ds41_errf(err, "dspark: the cache has no %d-slot ring for stage %d", W, s);
            break;
        }
        /* ---- attention sublayer */
        ds41_block_attn_in(ctx, cfg, lw, &b->s, 0, B, 0, B);
        /* context key of position P, written before this stage's attention */
        if (!reused) {
            ds41_attn_swa_k(ctx, cfg, lw, rope, b->cx, 1, &P32, b->kctx, b->rec);
            memcpy(ds41_ring_slot(ring, P), b->rec, (size_t)ring->rec_bytes);
        }
        ds41_attn_query(ctx, cfg, lw, rope, b->s.xa, B, pos, b->cq, b->q);
        ds41_swa_rec_unpack(cfg, ring->rec, W, b->kv);
        ds41_attn_swa_k(ctx, cfg, lw, rope, b->s.xa, B, pos, b->kv + (size_t)W * D, NULL);
        ds41_kvset kvs = { { b->kv, b->kv + (size_t)W * D, NULL }, { W, B, 0 }, { NULL, NULL, NULL } };
        ds41_sparse_attn(ctx, cfg->n_heads, D, b->q, B, &kvs, b->list, L, lw->attn_sink, scale, b->o);
        ds41_attn_output(ctx, cfg, lw, rope, b->o, B, pos, b->wos, b->s.y);
        ds41_block_attn_out(ctx, cfg, &b->s, 0, B);
        /* ---- MoE sublayer (the stage's expert counts from the plan; drafts are text) */
        ds41_block_ffn(ctx, cfg, lw, lp, &b->s, 0, B, NULL);
    }
    if (rc) return -1;
    /* the un-normalised collapse of every row (the confidence head reads it); the final norm
     * and the vocabulary head run per row in ds41_dspark_next */
    size_t hc = (size_t)cfg->hc_mult;
    ds41_hc_apply_pre(ctx, b->s.X, b->s.pre, B, (int)hc, dim, b->s.xin);
    b->t_next = t_next;
    memset(b->conf_ok, 0, sizeof b->conf_ok);
    b->ready = 1;
    return 0;
}

int ds41_dspark_made(const ds41_dspark_work *b) { return b && b->ready ? b->made : 0; }
const int32_t *ds41_dspark_ids(const ds41_dspark_work *b) { return b->ids; }

/* the Markov embedding of token prev (its BF16 row of rank values widened) into out */
static void markov_row(const ds41_layer_weights *last, int rank, int32_t prev, float *out) {
    const uint16_t *mr = last->markov_embed.w + (size_t)prev * rank;
    for (int r = 0; r < rank; r++) out[r] = ds41_bf16_to_f32(mr[r]);
}
/* ... into cin[dim ..] of a work buffer */
static void markov_embed(const ds41_layer_weights *last, ds41_dspark_work *b, int32_t prev) {
    markov_row(last, b->rank, prev, b->cin + b->dim);
}

int ds41_dspark_conf(const ds41_engine *e, ds41_dspark_work *b, int k, float *conf) {
    if (!b->ready || k < 0 || k >= b->B || k > b->made) return -1;
    int32_t prev = k == 0 ? b->t_next : b->ids[k - 1];
    if (!b->conf_ok[k] || b->conf_prev[k] != prev) {
        const ds41_config *cfg = e->cfg;
        const ds41_layer_weights *last = &e->w->layers[cfg->n_layers + cfg->n_mtp - 1];
        /* confidence of draft k from the un-normalised collapse of row k and the previous
         * token's Markov embedding, an FP32 linear */
        markov_embed(last, b, prev);
        memcpy(b->cin, b->s.xin + (size_t)k * b->dim, (size_t)b->dim * sizeof(float));
        ds41_linear_bf16(&e->ctx, &last->conf_proj, b->cin, 1, &b->conf[k], 0);
        b->conf_ok[k] = 1;
        b->conf_prev[k] = prev;
    }
    *conf = b->conf[k];
    return 0;
}

int ds41_dspark_next(const ds41_engine *e, ds41_dspark_work *b, ds41_sampler *sampler, int32_t *id) {
    if (!b->ready || b->made >= b->B) return -1;
    const ds41_config *cfg = e->cfg;
    const ds41_ctx *ctx = &e->ctx;
    const ds41_layer_weights *last = &e->w->layers[cfg->n_layers + cfg->n_mtp - 1];
    int k = b->made, V = b->V, dim = b->dim;
    /* base logits of row k: final norm of the collapse, the vocabulary head */
    ds41_rmsnorm(ctx, b->s.xin + (size_t)k * dim, last->final_norm, 1, dim, cfg->norm_eps, b->s.xa + (size_t)k * dim);
    ds41_bf16w head = { e->w->head, cfg->vocab_size, cfg->dim };
    ds41_linear_bf16(ctx, &head, b->s.xa + (size_t)k * dim, 1, b->base, 0);
    /* + the Markov bias of the previous token */
    int32_t prev = k == 0 ? b->t_next : b->ids[k - 1];
    markov_embed(last, b, prev);
    ds41_linear_bf16(ctx, &last->markov_head, b->cin + dim, 1, b->bias, 0);
    for (int v = 0; v < V; v++) b->base[v] = b->base[v] + b->bias[v];
    int next = sampler ? ds41_sample(sampler, b->base, V, b->scratch, b->iscratch) : ds41_argmax(b->base, V);
    b->ids[k] = next;
    b->made = k + 1;
    *id = next;
    return 0;
}

int ds41_dspark_propose(const ds41_engine *e, ds41_cache *c, const float *main_hidden_row, long long P,
                        int32_t t_next, ds41_sampler *sampler, int32_t *ids, float *conf, ds41_err *err) {
    return ds41_dspark_propose_ex(e, c, main_hidden_row, P, t_next, sampler, 0, ids, conf, err);
}

int ds41_dspark_propose_w(const ds41_engine *e, ds41_cache *c, ds41_dspark_work *w, const float *main_hidden_row,
                          long long P, int32_t t_next, ds41_sampler *sampler, int reuse, int32_t *ids, float *conf,
                          ds41_err *err) {
    if (ds41_dspark_begin(e, c, w, main_hidden_row, P, t_next, reuse, err)) return -1;
    for (int k = 0; k < w->B; k++) {
        if (ds41_dspark_conf(e, w, k, &conf[k]) || ds41_dspark_next(e, w, sampler, &ids[k]))
            return ds41_errf(err, "dspark: draft %d out of order", k);
    }
    return 0;
}

int ds41_dspark_propose_ex(const ds41_engine *e, ds41_cache *c, const float *main_hidden_row, long long P,
                           int32_t t_next, ds41_sampler *sampler, int reuse, int32_t *ids, float *conf, ds41_err *err) {
    ds41_dspark_work *w = ds41_dspark_work_new(e, err);
    if (!w) return -1;
    int rc = ds41_dspark_propose_w(e, c, w, main_hidden_row, P, t_next, sampler, reuse, ids, conf, err);
    ds41_dspark_work_free(w);
    return rc;
}

/* ---- n proposals at once (ds41_dspark_propose_batch) */

int ds41_dspark_propose_batch(const ds41_engine *e, int n, ds41_cache *const *c, const float *const *mh_row,
                              const long long *P, const int32_t *t_next, const int *reuse, int nd, int32_t *const *ids,
                              float *const *conf, ds41_err *err) {
    if (check_model(e, err)) return -1;
    if (n < 1) return 0;
    const ds41_config *cfg = e->cfg;
    const ds41_weights *w = e->w;
    const ds41_ctx *ctx = &e->ctx;
    const int B = cfg->dspark_block_size, dim = cfg->dim, W = cfg->window, D = cfg->head_dim;
    const int HD = cfg->n_heads * cfg->head_dim, V = cfg->vocab_size, rank = cfg->dspark_markov_rank;
    if (cfg->dspark_noise_token_id < 0 || cfg->dspark_noise_token_id >= V)
        return ds41_errf(err, "dspark: dspark_noise_token_id %d outside the vocabulary", cfg->dspark_noise_token_id);
    for (int i = 0; i < n; i++) {
        if (P[i] < 1) return ds41_errf(err, "dspark: a proposal needs P >= 1 (got %lld)", P[i]);
        if (P[i] >= e->max_pos) return ds41_errf(err, "dspark: position %lld outside the context of %lld", P[i], e->max_pos);
        if (t_next[i] < 0 || t_next[i] >= V) return ds41_errf(err, "dspark: token %d outside the vocabulary of %d", t_next[i], V);
    }
    if ((size_t)n * (size_t)B > (size_t)INT32_MAX / ((size_t)HD + (size_t)dim + (size_t)V))
        return ds41_errf(err, "dspark: %d proposals of %d rows are too many for one batch", n, B);
    if (nd < 1 || nd > B) nd = B;
    const size_t R = (size_t)n * B;   /* the rows of every block, block i at rows i B .. i B + B - 1 */
    ds41_stream S;
    int fail = ds41_stream_alloc(&S, cfg, R) != 0;
    float *cx = zalloc((size_t)n * dim, sizeof(float), &fail);
    int *rused = zalloc((size_t)n, sizeof(int), &fail);
    int *pos = zalloc(R, sizeof(int), &fail);
    float *kctx = zalloc((size_t)D, sizeof(float), &fail);
    uint8_t *rec = zalloc((size_t)ds41_swa_rec_bytes(cfg), 1, &fail);
    float *cq = zalloc(R * cfg->q_lora_rank, sizeof(float), &fail);
    float *q = zalloc(R * HD, sizeof(float), &fail);
    float *kblk = zalloc(R * D, sizeof(float), &fail);
    float *kv = zalloc(((size_t)W + B) * D, sizeof(float), &fail);
    int32_t *list = zalloc((size_t)B * ((size_t)W + B), sizeof(int32_t), &fail);
    float *o = zalloc(R * HD, sizeof(float), &fail);
    float *wos = zalloc(R * cfg->o_groups * cfg->o_lora_rank, sizeof(float), &fail);
    float *cin = zalloc((size_t)n * (dim + rank), sizeof(float), &fail);   /* [row k of block i, Markov embedding] */
    float *me = zalloc((size_t)n * rank, sizeof(float), &fail);
    float *xk = zalloc((size_t)n * dim, sizeof(float), &fail);
    float *base = zalloc((size_t)n * V, sizeof(float), &fail);
    float *bias = zalloc((size_t)n * V, sizeof(float), &fail);
    float *cf = zalloc((size_t)n, sizeof(float), &fail);
    int rc = 0;
    if (fail) {
        rc = ds41_errf(err, "dspark: out of memory for %d proposals of %d rows", n, B);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        /* P5 as in ds41_dspark_begin: the seed's context row of P when it covered it */
        const ds41_cache *ci = c[i];
        rused[i] = reuse && reuse[i] && ci->dctx.n > 0 && P[i] >= ci->dctx.pos0 && P[i] < ci->dctx.pos0 + ci->dctx.n;
        if (rused[i]) memcpy(cx + (size_t)i * dim, ci->dctx.rows + (size_t)(P[i] - ci->dctx.pos0) * dim, (size_t)dim * sizeof(float));
        else if (ds41_dspark_context_into(e, mh_row[i], cx + (size_t)i * dim, err)) { rc = -1; goto done; }
        for (int j = 0; j < B; j++) {
            pos[(size_t)i * B + j] = (int)(P[i] + 1 + j);
            ds41_stream_embed(cfg, w, &S, (size_t)i * B + j, j == 0 ? t_next[i] : cfg->dspark_noise_token_id, NULL);
        }
    }
    const float scale = ds41_attn_scale(cfg);
    for (int s = 0; s < cfg->n_mtp && !rc; s++) {
        int l = cfg->n_layers + s;
        const ds41_layer_weights *lw = &w->layers[l];
        const ds41_layer_plan *lp = &cfg->layers[l];
        const ds41_rope *rope = &e->ropes[e->layer_rope[l]];
        for (int i = 0; i < n; i++)
            if (l >= c[i]->n_rings || c[i]->rings[l].slots != W) {
                rc = ds41_errf(err, "dspark: the cache has no %d-slot ring for stage %d", W, s);
                goto done;
            }
        /* ---- attention sublayer: the row-wise parts over every block's rows at once */
        ds41_block_attn_in(ctx, cfg, lw, &S, 0, (int)R, 0, (int)R);
        for (int i = 0; i < n; i++)
            if (!rused[i]) {
                int32_t Pi = (int32_t)P[i];
                ds41_attn_swa_k(ctx, cfg, lw, rope, cx + (size_t)i * dim, 1, &Pi, kctx, rec);
                memcpy(ds41_ring_slot(&c[i]->rings[l], P[i]), rec, (size_t)c[i]->rings[l].rec_bytes);
            }
        ds41_attn_query(ctx, cfg, lw, rope, S.xa, (int)R, pos, cq, q);
        ds41_attn_swa_k(ctx, cfg, lw, rope, S.xa, (int)R, pos, kblk, NULL);
        /* each block attends its own ring and its own keys (ds41_dspark_begin's list) */
        for (int i = 0; i < n; i++) {
            ds41_ring *ring = &c[i]->rings[l];
            int nring = P[i] + 1 < W ? (int)(P[i] + 1) : W, L = nring + B;
            block_list(list, nring, B, W);
            ds41_swa_rec_unpack(cfg, ring->rec, W, kv);
            memcpy(kv + (size_t)W * D, kblk + (size_t)i * B * D, (size_t)B * D * sizeof(float));
            ds41_kvset kvs = { { kv, kv + (size_t)W * D, NULL }, { W, B, 0 }, { NULL, NULL, NULL } };
            ds41_sparse_attn(ctx, cfg->n_heads, D, q + (size_t)i * B * HD, B, &kvs, list, L, lw->attn_sink, scale,
                             o + (size_t)i * B * HD);
        }
        ds41_attn_output(ctx, cfg, lw, rope, o, (int)R, pos, wos, S.y);
        ds41_block_attn_out(ctx, cfg, &S, 0, (int)R);
        /* ---- MoE sublayer over every block's rows */
        ds41_block_ffn(ctx, cfg, lw, lp, &S, 0, (int)R, NULL);
    }
    if (rc) goto done;
    ds41_hc_apply_pre(ctx, S.X, S.pre, (int)R, cfg->hc_mult, dim, S.xin);
    /* draft k of every block: its confidence, then its head and Markov passes over n rows */
    const ds41_layer_weights *last = &w->layers[cfg->n_layers + cfg->n_mtp - 1];
    ds41_bf16w head = { w->head, cfg->vocab_size, cfg->dim };
    for (int i = 0; i < n; i++)   /* the drafts not made (k >= nd): 0, confidence 0 */
        for (int k = nd; k < B; k++) ids[i][k] = 0, conf[i][k] = 0.0f;
    for (int k = 0; k < nd; k++) {
        for (int i = 0; i < n; i++) {
            int32_t prev = k == 0 ? t_next[i] : ids[i][k - 1];
            float *ci = cin + (size_t)i * (dim + rank);
            memcpy(ci, S.xin + ((size_t)i * B + k) * dim, (size_t)dim * sizeof(float));
            markov_row(last, rank, prev, me + (size_t)i * rank);
            memcpy(ci + dim, me + (size_t)i * rank, (size_t)rank * sizeof(float));
            memcpy(xk + (size_t)i * dim, S.xin + ((size_t)i * B + k) * dim, (size_t)dim * sizeof(float));
        }
        ds41_linear_bf16(ctx, &last->conf_proj, cin, n, cf, 0);
        ds41_rmsnorm(ctx, xk, last->final_norm, n, dim, cfg->norm_eps, xk);
        ds41_linear_bf16(ctx, &head, xk, n, base, 0);
        ds41_linear_bf16(ctx, &last->markov_head, me, n, bias, 0);
        for (int i = 0; i < n; i++) {
            float *bi = base + (size_t)i * V;
            const float *mi = bias + (size_t)i * V;
            for (int v = 0; v < V; v++) bi[v] = bi[v] + mi[v];
            conf[i][k] = cf[i];
            ids[i][k] = ds41_argmax(bi, V);
        }
    }
done:
    ds41_stream_free(&S);
    free(cx); free(rused); free(pos); free(kctx); free(rec); free(cq); free(q); free(kblk); free(kv); free(list);
    free(o); free(wos); free(cin); free(me); free(xk); free(base); free(bias); free(cf);
    return rc ? -1 : 0;
}
