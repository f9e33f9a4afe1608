/* ds41 forward pass: the block loop of spec 3.1, readable top to bottom.
 *
 *   tokens -> Engram hash ids, embedding, 4 stream copies
 *   for each layer: [Engram] -> [DSpark tap] -> mHC pre-mix -> attention -> mHC post-mix
 *                    -> mHC pre-mix -> MoE -> mHC post-mix
 *   collapse (apply_pre with the last FFN's pre) -> final norm -> head -> logits
 *
 * Rows. A forward covers positions [P, P+T). Layer l computes its attention input x and its
 * SWA key on rows [krow, T) and its attention + MoE output on rows [qrow, T) (ds41_row_plan):
 * everything in a full prefill, fewer decoder rows in a CED prefill. Because every row that is
 * computed uses exactly the per-query lists of the full prefill, the two are bit-identical
 * on every value they both compute.
 *
 * One loop. A single sequence is a batch of one: ds41_forward, ds41_forward_rows and
 * ds41_forward_batch all run fwd_run, which stacks the rows of its sequences (sequence 0 first,
 * the only one that may carry a row plan), runs every projection once over the stack, and
 * hands what reads or writes a sequence's state to fwd_attn.c per sequence. The MoE sublayer
 * reaches the routed experts through the engine's dispatch (moe.h): local in one process,
 * across ranks under MPI (src/dist/), so this loop does not know how many processes run it.
 *
 * Hooks. Per-step work (an Engram prefetch, a KV shipment) belongs at the marked points of
 * fwd_run: after the embedding (the step's token ids are known), before a layer, after a
 * layer's attention (its KV is written). */
#include "forward.h"
#include "fwd_attn.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "dist.h"
#include "dist_pipe.h"
#include "engram_place.h"
#include "formats.h"
#include "mhc.h"
#include "moe.h"


/* ====================================================================== engine */

int ds41_engine_init(ds41_engine *e, ds41_model *m, int own_model, int exact, int n_threads,
                     long long max_pos, int32_t *token_map, int n_compressed, ds41_err *err) {
    memset(e, 0, sizeof *e);
    e->model = m;
    e->own_model = own_model;
    e->cfg = &m->cfg;
    e->w = &m->w;
    e->token_map = token_map;   /* owned from here on, also on failure */
    e->n_compressed = n_compressed;
    const ds41_config *cfg = e->cfg;
    if (!m->st) return ds41_errf(err, "%s: the checkpoint holds no tensors (config.json only)", m->dir ? m->dir : "model");
    if (max_pos < 1 || max_pos > cfg->max_position_embeddings)
        return ds41_errf(err, "context size %lld outside 1..%lld (max_position_embeddings)", max_pos,
                         cfg->max_position_embeddings);
    if (max_pos > (1LL << 30)) return ds41_errf(err, "context size %lld too large", max_pos);
    e->max_pos = max_pos;
    e->ctx.exact = exact;
    e->ctx.n_threads = n_threads < 1 ? 1 : n_threads;
    e->ctx.pool = e->ctx.n_threads > 1 ? ds41_pool_create(e->ctx.n_threads) : NULL;
    /* P6 starts off (measured slower on the CPUs here: README); ds41_engine_set_ablate turns it
     * on and creates its side worker */
    e->ctx.ablate = DS41_ABLATE_P6;
    int np = cfg->n_layers + cfg->n_mtp;
    e->layer_rope = calloc((size_t)np, sizeof(int));
    if (!e->layer_rope) return ds41_errf(err, "out of memory");
    /* one RoPE table per distinct (theta, yarn); DSpark blocks reach P + block_size */
    int rope_max = (int)max_pos + cfg->dspark_block_size + 1;
    for (int l = 0; l < np; l++) {
        const ds41_layer_plan *lp = &cfg->layers[l];
        /* find an existing table with the same parameters */
        int found = -1;
        for (int j = 0; j < l; j++)
            if (cfg->layers[j].rope_theta == lp->rope_theta && cfg->layers[j].yarn == lp->yarn) { found = e->layer_rope[j]; break; }
        if (found >= 0) { e->layer_rope[l] = found; continue; }
        if (e->n_ropes >= 4) return ds41_errf(err, "too many distinct RoPE settings");
        if (ds41_rope_init(&e->ropes[e->n_ropes], cfg, lp->rope_theta, lp->yarn, rope_max, err)) return -1;
        e->layer_rope[l] = e->n_ropes++;
    }
    if (cfg->n_engram_layers > 0) {
        if (!token_map) return ds41_errf(err, "config has Engram layers but no Engram token map was given");
        if (ds41_engram_consts_init(&e->eg, cfg, err)) return -1;
        e->has_engram = 1;
    }
    return 0;
}

void ds41_engine_free(ds41_engine *e) {
    ds41_engine_twin_free(e);
    for (int i = 0; i < e->n_ropes; i++) ds41_rope_free(&e->ropes[i]);
    free(e->layer_rope);
    free(e->token_map);
    if (e->ctx.pool) ds41_pool_destroy(e->ctx.pool);
    ds41_side_destroy(e->side);
    ds41_readahead_free(e->ra);
    ds41_engine_engram_free(e);
    ds41_pipe_close(e->pipe);
    ds41_route_count_free(e->routes);
    ds41_dist_weights_closing(e->w);   /* the job's view of the experts ends with the mapping */
    if (e->own_model && e->model) { ds41_model_close(e->model); free(e->model); }
    memset(e, 0, sizeof *e);
}

int ds41_seq_init(ds41_seq *s, ds41_engine *e, ds41_err *err) {
    memset(s, 0, sizeof *s);
    s->e = e;
    if (ds41_cache_init(&s->cache, e->cfg, e->max_pos, err)) return -1;
    s->logits = calloc((size_t)e->cfg->vocab_size, sizeof(float));
    if (!s->logits) { ds41_cache_free(&s->cache); return ds41_errf(err, "out of memory"); }
    return 0;
}

void ds41_seq_free(ds41_seq *s) {
    ds41_engram_step_free(s->eg_step);
    ds41_fwd_scratch_free(s);
    ds41_cache_free(&s->cache);
    free(s->logits);
    free(s->main_hidden);
    memset(s, 0, sizeof *s);
}

/* ====================================================================== stream */

int ds41_stream_alloc(ds41_stream *b, const ds41_config *cfg, size_t n) {
    size_t hc = (size_t)cfg->hc_mult, dim = (size_t)cfg->dim, m = n ? n : 1;
    memset(b, 0, sizeof *b);
    float **f[] = { &b->X, &b->X2, &b->pre, &b->a_pre, &b->a_post, &b->a_C, &b->f_pre, &b->f_post, &b->f_C,
                    &b->xin, &b->xa, &b->y };
    size_t per_row[] = { hc * dim, hc * dim, hc, hc, hc, hc * hc, hc, hc, hc * hc, dim, dim, dim };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (per_row[i] > SIZE_MAX / sizeof(float) / m || !(*f[i] = calloc(m * per_row[i], sizeof(float)))) {
            ds41_stream_free(b);
            return -1;
        }
    }
    return 0;
}

void ds41_stream_free(ds41_stream *b) {
    float *f[] = { b->X, b->X2, b->pre, b->a_pre, b->a_post, b->a_C, b->f_pre, b->f_post, b->f_C, b->xin, b->xa, b->y };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    memset(b, 0, sizeof *b);
}

void ds41_stream_embed(const ds41_config *cfg, const ds41_weights *w, ds41_stream *b, size_t t, int32_t tok,
                       const float *emb) {
    int hc = cfg->hc_mult, dim = cfg->dim;
    const uint16_t *er = w->embed + (size_t)tok * dim;
    for (int c = 0; c < hc; c++) {
        float *xr = b->X + (t * hc + c) * dim;
        if (emb) memcpy(xr, emb, (size_t)dim * sizeof(float));
        else for (int d = 0; d < dim; d++) xr[d] = ds41_bf16_to_f32(er[d]);
    }
    for (int c = 0; c < hc; c++) b->pre[t * hc + c] = c == 0 ? 1.0f : 0.0f;
}

void ds41_block_attn_in(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw, ds41_stream *b,
                        size_t m0, int nm, size_t x0, int nx) {
    size_t hc = (size_t)cfg->hc_mult, dim = (size_t)cfg->dim;
    if (nm > 0)
        ds41_hc_mixes(ctx, cfg, lw->hc_attn_fn, lw->hc_attn_base, lw->hc_attn_scale, b->X + m0 * hc * dim, nm,
                      b->a_pre + m0 * hc, b->a_post + m0 * hc, b->a_C + m0 * hc * hc);
    ds41_hc_apply_pre(ctx, b->X + x0 * hc * dim, b->pre + x0 * hc, nx, (int)hc, (int)dim, b->xin + x0 * dim);
    ds41_rmsnorm(ctx, b->xin + x0 * dim, lw->attn_norm, nx, (int)dim, cfg->norm_eps, b->xa + x0 * dim);
}

void ds41_block_attn_out(const ds41_ctx *ctx, const ds41_config *cfg, ds41_stream *b, size_t r0, int n) {
    size_t hc = (size_t)cfg->hc_mult, dim = (size_t)cfg->dim;
    ds41_hc_apply_post(ctx, b->y + r0 * dim, b->X + r0 * hc * dim, b->a_post + r0 * hc, b->a_C + r0 * hc * hc, n,
                       (int)hc, (int)dim, b->X2 + r0 * hc * dim);
}

void ds41_block_ffn(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_layer_weights *lw,
                    const ds41_layer_plan *lp, ds41_stream *b, size_t r0, int n, int *msel) {
    size_t hc = (size_t)cfg->hc_mult, dim = (size_t)cfg->dim, sr = hc * dim;
    ds41_hc_mixes(ctx, cfg, lw->hc_ffn_fn, lw->hc_ffn_base, lw->hc_ffn_scale, b->X2 + r0 * sr, n, b->f_pre + r0 * hc,
                  b->f_post + r0 * hc, b->f_C + r0 * hc * hc);
    /* the delayed hand-off: the FFN input is collapsed with the attention sublayer's pre */
    ds41_hc_apply_pre(ctx, b->X2 + r0 * sr, b->a_pre + r0 * hc, n, (int)hc, (int)dim, b->xin + r0 * dim);
    ds41_rmsnorm(ctx, b->xin + r0 * dim, lw->ffn_norm, n, (int)dim, cfg->norm_eps, b->xa + r0 * dim);
    ds41_moe(ctx, cfg, lw, lp, b->xa + r0 * dim, n, b->img ? b->img + r0 : NULL, b->y + r0 * dim, msel);
    ds41_hc_apply_post(ctx, b->y + r0 * dim, b->X2 + r0 * sr, b->f_post + r0 * hc, b->f_C + r0 * hc * hc, n, (int)hc,
                       (int)dim, b->X + r0 * sr);
    memcpy(b->pre + r0 * hc, b->f_pre + r0 * hc, (size_t)n * hc * sizeof(float));
}

void ds41_stream_head(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_weights *w, const uint16_t *norm,
                      ds41_stream *b, size_t r0, int n, float *logits) {
    size_t hc = (size_t)cfg->hc_mult, dim = (size_t)cfg->dim;
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_HEAD, 0);
    ds41_hc_apply_pre(ctx, b->X + r0 * hc * dim, b->pre + r0 * hc, n, (int)hc, (int)dim, b->xin + r0 * dim);
    ds41_rmsnorm(ctx, b->xin + r0 * dim, norm, n, (int)dim, cfg->norm_eps, b->xa + r0 * dim);
    ds41_bf16w head = { w->head, cfg->vocab_size, cfg->dim };
    ds41_linear_bf16(ctx, &head, b->xa + r0 * dim, n, logits, 0);   /* the BF16 head's stream (kernels.h) */
    if (ctx->bd) ds41_bd_leave(ctx);
}

/* ====================================================================== row plan */

void ds41_row_plan(const ds41_config *cfg, ds41_prefill_mode mode, int T, int need_logits,
                   int *qrow, int *krow, int *lo) {
    int L = cfg->n_layers, W = cfg->window;
    for (int l = 0; l < L; l++) qrow[l] = krow[l] = lo[l] = 0;
    if (mode == DS41_PREFILL_FULL || T <= 1) return;
    int q = need_logits ? T - 1 : T;
    int s = T - W > 0 ? T - W : 0;
    int replay_start = cfg->first_decoder_layer + 1;
    for (int l = L - 1; l >= 0; l--) {
        const ds41_layer_plan *lp = &cfg->layers[l];
        if (mode == DS41_PREFILL_REPLAY && l >= replay_start && !lp->is_kv_source) {
            /* decoder replay: only the last window, windows truncated to it */
            qrow[l] = krow[l] = lo[l] = s;
            q = s;
            continue;
        }
        /* Rows layer l must output: q (what layer l+1 reads). Its keys must cover the
         * windows of those queries and the rows its ring keeps (the last W); a compressor
         * needs every row. */
        int k = q - (W - 1);
        if (T - W < k) k = T - W;
        if (lp->is_kv_source && mode != DS41_PREFILL_RESTORE) k = 0;
        if (k < 0) k = 0;
        qrow[l] = q;
        krow[l] = k;
        q = k;
    }
}

/* ====================================================================== forward */

/* Engram hash ids (spec 3.2; integer only, from the token history) of the T rows of one
 * sequence at positions P.. into ids[(slot * N + r0 + t) * cols] (N stacked rows), and its new
 * history (compressed ids of the last 16 positions, most recent first) into hist_new. Image
 * rows (img[t], img may be NULL) are DS41_ENGRAM_DEAD in the history: no n-gram spans them. */
static int engram_ids(const ds41_engine *e, const ds41_cache *cache, const int32_t *tokens, const uint8_t *img, int T,
                      long long P, int64_t *ids, size_t r0, size_t N, int32_t *hist_new) {
    const ds41_config *cfg = e->cfg;
    int nh = cfg->engram_max_ngram, cols = ds41_fwd_eg_cols(cfg);
    int32_t pad = e->token_map[cfg->engram_pad_id];
    int64_t *one = malloc((size_t)cfg->n_engram_layers * cols * sizeof(int64_t));
    if (!one) return -1;
    for (int t = 0; t < T; t++) {
        long long p = P + t;
        int32_t h[16];
        for (int k = 0; k < nh && k < 16; k++) {
            long long qp = p - k;
            if (qp < 0) h[k] = pad;
            else if (qp >= P) h[k] = img && img[qp - P] ? DS41_ENGRAM_DEAD : e->token_map[tokens[qp - P]];
            else h[k] = cache->hist[P - 1 - qp];
        }
        ds41_engram_hash(&e->eg, h, p, pad, one);
        for (int sl = 0; sl < cfg->n_engram_layers; sl++)
            memcpy(ids + ((size_t)sl * N + r0 + t) * cols, one + (size_t)sl * cols, (size_t)cols * sizeof(int64_t));
    }
    free(one);
    for (int k = 0; k < 16; k++) {
        long long qp = P + T - 1 - k;
        hist_new[k] = qp < 0                        ? 0
                      : qp < P                      ? cache->hist[P - 1 - qp]
                      : img && img[qp - P] ? DS41_ENGRAM_DEAD
                                                    : e->token_map[tokens[qp - P]];
    }
    return 0;
}

/* DSpark tap of target ti (of n_tg) on rows [r0, r1) of the block's input stream X: the mean
 * over the hc copies, BF16, into mh [rows, n_tg, dim]. */
static void dspark_tap(const ds41_ctx *ctx, const ds41_config *cfg, const float *X, size_t r0, size_t r1, int ti,
                       int n_tg, float *mh) {
    int hc = cfg->hc_mult, dim = cfg->dim;
    size_t srow = (size_t)hc * dim;
    for (size_t t = r0; t < r1; t++)
        for (int d = 0; d < dim; d++) {
            float *o = mh + (t * n_tg + ti) * dim + d;
            if (ctx->exact) {
                double acc = 0.0;
                for (int c = 0; c < hc; c++) acc += X[t * srow + (size_t)c * dim + d];
                *o = ds41_bf16_round((float)(acc / hc));
            } else {
                float fa = 0.0f;
                for (int c = 0; c < hc; c++) fa += X[t * srow + (size_t)c * dim + d];
                *o = ds41_bf16_round(fa / (float)hc);
            }
        }
}

static int dspark_target_index(const ds41_config *cfg, int n_tg, int l) {
    for (int ti = 0; ti < n_tg; ti++) if (cfg->dspark_targets[ti] == l) return ti;
    return -1;
}

/* Checks of a forward over tokens[T] at the sequence's position. */
static int forward_check(const ds41_seq *s, const int32_t *tokens, int T, ds41_err *err) {
    const ds41_config *cfg = s->e->cfg;
    long long P = s->cache.pos;
    if (T < 1) return ds41_errf(err, "forward: no tokens");
    if (P + T > s->cache.max_pos)
        return ds41_errf(err, "forward: positions %lld..%lld exceed the context size %lld", P, P + T - 1, s->cache.max_pos);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= cfg->vocab_size)
            return ds41_errf(err, "token id %d at position %lld is outside the vocabulary (0..%d)", tokens[t], P + t,
                             cfg->vocab_size - 1);
    return 0;
}

static long long max_entries(const ds41_cache *cache, long long end) {
    long long Emax = 0;
    for (int i = 0; i < cache->n_stores; i++) {
        long long E = end / cache->stores[i].ratio;
        if (E > Emax) Emax = E;
    }
    return Emax;
}

/* After a forward over [P, P + T): the DSpark context rows of the rows [r0, T) every target
 * computed (mh [T, n_tg, dim], taken over), the Engram history, the position. */
static void forward_commit(ds41_seq *s, int T, const int32_t *hist_new, float *mh, int r0) {
    const ds41_config *cfg = s->e->cfg;
    int n_tg = cfg->n_dspark_targets, dim = cfg->dim;
    s->cache.pos += T;
    if (s->e->has_engram) memcpy(s->cache.hist, hist_new, sizeof s->cache.hist);
    free(s->main_hidden);
    s->main_hidden = NULL;
    s->mh_rows = 0;
    if (mh) {
        s->mh_rows = T - r0;
        s->mh_pos0 = s->cache.pos - T + r0;
        memmove(mh, mh + (size_t)r0 * n_tg * dim, (size_t)s->mh_rows * n_tg * dim * sizeof(float));
        s->main_hidden = mh;
    }
}

/* The row plan of a forward of T rows of s in mode pmode. A chunk of a longer prompt
 * (s->plan_ahead > 0, CED, no restore or verify, may_ahead): the plan of the rows [P, P + T +
 * ahead) with the last wanting logits, cut to this chunk. Every plan row is the prompt's end
 * minus a distance (or 0), so planning from the chunk's first row gives each of its rows the
 * one-shot plan's; a row at or past T is one a later chunk computes. */
static int seq_row_plan(const ds41_seq *s, ds41_prefill_mode pmode, int T, int want_logits, int may_ahead, int *qrow,
                        int *krow, int *lo, ds41_err *err) {
    const ds41_config *cfg = s->e->cfg;
    if (s->plan_ahead > 0 && pmode == DS41_PREFILL_CED && !s->restore && !s->verify && may_ahead) {
        if (s->plan_ahead > (long long)INT32_MAX - T)
            return ds41_errf(err, "forward: a prompt of %lld rows is too long to plan", s->plan_ahead + T);
        ds41_row_plan(cfg, pmode, T + (int)s->plan_ahead, 1, qrow, krow, lo);
        for (int l = 0; l < cfg->n_layers; l++) {
            if (qrow[l] > T) qrow[l] = T;
            if (krow[l] > T) krow[l] = T;
            if (lo[l] > T) lo[l] = T;
        }
    } else {
        ds41_row_plan(cfg, pmode, T, want_logits, qrow, krow, lo);
    }
    /* a forward that ends at a layer's keys (s->stop_layer): no output from it, nothing after */
    for (int l = s->stop_layer; s->stop_layer > 0 && l < cfg->n_layers; l++) {
        qrow[l] = T;
        if (l > s->stop_layer) krow[l] = T;
    }
    return 0;
}


/* ====================================================================== the layer loop */

/* The per-layer hook of every sequence that has one (ds41_seq.layer_done). */
static void layer_done(ds41_seq *const *ss, int count, int l) {
    for (int i = 0; i < count; i++)
        if (ss[i]->layer_done) ss[i]->layer_done(ss[i]->layer_done_arg, ss[i], l);
}

/* --split layers: the head's rows [h0, N) at lg shared by the last stage (ds41_pipe_share),
 * each sequence's last row for its logits; its DS41_PIPE_* flags. A sequence whose rows[i] is
 * set wants every row: outside a deferred step they go to every rank (m < 0, into lg); in
 * serve's pipelined step (a verify block) each of its rows is listed, row t into rows[i] + t x V,
 * for rank 0's collect. */
static int pipe_share_batch(struct ds41_pipe *p, ds41_seq *const *ss, const int *T, const size_t *r0, float *const *rows,
                            int count, size_t h0, float *lg, size_t N, size_t V, ds41_err *err) {
    int later = ds41_pipe_deferred(p);
    size_t cap = (size_t)count;
    for (int i = 0; later && rows && i < count; i++) cap += rows[i] ? (size_t)T[i] : 0;
    float **dst = malloc(cap * sizeof *dst);
    size_t *at = malloc(cap * sizeof *at);
    if (!dst || !at) { free(dst); free(at); return ds41_errf(err, "out of memory"); }
    int m = 0;
    for (int i = 0; i < count && m >= 0; i++) {
        if (r0[i] + (size_t)T[i] <= h0) continue;
        if (rows && rows[i] && !later) { m = -1; break; }   /* every row wanted, by every rank */
        for (size_t t = 0; rows && rows[i] && t < (size_t)T[i]; t++)
            if (r0[i] + t >= h0) dst[m] = rows[i] + t * V, at[m++] = r0[i] + t - h0;
        dst[m] = ss[i]->logits, at[m++] = r0[i] + (size_t)T[i] - 1 - h0;
    }
    int sh = ds41_pipe_share(p, lg, (N - h0) * V, V, dst, at, m, err->msg, sizeof err->msg);
    free(dst);
    free(at);
    return sh;
}

/* One forward over the stacked sequences ss[0..count): sequence i runs tokens[i][0..T[i]) at
 * its position. Sequence 0 carries the row plan qrow / krow / lo (all zero: every row); the
 * head runs on the stacked rows [h0, N) (h0 >= r0 of sequence 1: only sequence 0 may leave
 * rows out). rows[i] (NULL, or NULL entries) get a sequence's logits rows; s->logits gets its
 * last row when the head reaches it. */
static int fwd_run(ds41_seq *const *ss, const int32_t *const *tokens, const int *T, float *const *rows, int count,
                   const int *qrow, const int *krow, const int *lo, size_t h0, ds41_err *err) {
    ds41_engine *e = ss[0]->e;
    const ds41_config *cfg = e->cfg;
    const ds41_weights *w = e->w;
    const ds41_ctx *ctx = &e->ctx;
    int L = cfg->n_layers, dim = cfg->dim, V = cfg->vocab_size;
    size_t N = 0, Tmax = 0;
    long long Emax = 0;
    for (int i = 0; i < count; i++) {
        N += (size_t)T[i];
        if ((size_t)T[i] > Tmax) Tmax = (size_t)T[i];
        long long E = max_entries(&ss[i]->cache, ss[i]->cache.pos + T[i]);
        if (E > Emax) Emax = E;
    }
    /* ---- hook: the step's plan is known (token ids, positions, row counts) ---- */
    if (e->step) {
        long long *pos = malloc((size_t)count * sizeof *pos);
        if (!pos) return ds41_errf(err, "out of memory");
        for (int i = 0; i < count; i++) pos[i] = ss[i]->cache.pos;
        int hr = e->step(count, pos, T, tokens, err->msg, sizeof err->msg);
        free(pos);
        if (hr) return -1;
    }

    /* ---- buffers: the stacked rows (one sequence: its scratch's), per sequence its view ---- */
    int n_tg = cfg->n_mtp > 0 ? cfg->n_dspark_targets : 0, cols = ds41_fwd_eg_cols(cfg);
    size_t D = (size_t)cfg->head_dim;
    fwd_buf tmp, own, *bp = NULL;
    seq_part tmp_sp;
    fwd_buf *v = calloc((size_t)count, sizeof *v);
    uint8_t *cut_buf = NULL;   /* --split layers: what crosses a cut besides the stream */
    size_t cut_cap = 0;
    size_t *r0 = calloc((size_t)count, sizeof *r0);
    int *layout = calloc((size_t)count, sizeof *layout);
    int32_t (*hist)[16] = calloc((size_t)count, sizeof *hist);
    float *mh = n_tg > 0 ? calloc(N * n_tg * dim, sizeof(float)) : NULL;
    float *cproj = count > 1 ? malloc(2 * N * D * sizeof(float)) : NULL;
    float *iq = malloc((N * cfg->index_n_heads * cfg->index_head_dim + 1) * sizeof(float));
    float *wt = malloc((N * cfg->index_n_heads + 1) * sizeof(float));
    /* the head's rows: one sequence writes them where they go, a batch stacks them first */
    float *lg = count > 1 ? malloc(((N - h0) + 1) * V * sizeof(float)) : NULL;
    /* image rows of the stacked sequences (NULL when every row is text) */
    uint8_t *img = NULL;
    for (int i = 0, r = 0; i < count; r += T[i], i++)
        if (ss[i]->ov_img) {
            if (!img && !(img = calloc(N, 1))) break;
            memcpy(img + r, ss[i]->ov_img, (size_t)T[i]);
        }
    int fail = !v || !r0 || !layout || !hist || (n_tg > 0 && !mh) || (count > 1 && (!cproj || !lg)) || !iq || !wt;
    for (int i = 0; i < count; i++) fail |= ss[i]->ov_img && !img;
    if (!fail) {
        if (count == 1) bp = ds41_fwd_acquire(ss[0], N, Emax, &tmp, &tmp_sp);
        else if (ds41_fwd_buf_alloc(&own, e, N, Tmax, Emax) == 0) bp = &own;
        fail = !bp;
    }
    fwd_buf b;
    if (bp) {
        b = *bp;
        b.s.img = img;
    }
    for (int i = 0, r = 0; i < count && !fail; r += T[i], i++) {
        ds41_seq *s = ss[i];
        long long P = s->cache.pos;
        r0[i] = (size_t)r;
        layout[i] = P == 0 ? LAYOUT_ONESHOT : T[i] == 1 ? LAYOUT_DECODE : s->verify ? LAYOUT_VERIFY : LAYOUT_EXTEND;
        ds41_fwd_view(&v[i], &b, cfg, r0[i]);
        if (count == 1) {
            v[i].sp = b.sp;   /* ds41_fwd_acquire marked it stale */
        } else {
            struct ds41_fwd_scratch *x = ds41_fwd_scratch_get(s);   /* its own index keys, top-k lists, pool */
            if (!x) { fail = 1; break; }
            v[i].sp = ds41_fwd_scratch_part(x);
            ds41_fwd_part_begin(v[i].sp);
        }
    }
    fwd_seqs fs = { ss, v, T, r0, layout, count, N, cproj, iq, wt };
    int rc = 0;
    if (fail) { rc = ds41_errf(err, "out of memory for a forward of %d sequence(s) over %zu rows", count, N); goto done; }

    /* ---- per sequence: positions, Engram hash ids (spec 3.2), embedding (4 identical copies,
     * pre = one-hot copy 0) ---- */
    for (int i = 0; i < count; i++) {
        ds41_seq *s = ss[i];
        s->ik_owner0 = s->cache.ik_owner;   /* [verify] the published owner before this forward */
        for (int t = 0; t < T[i]; t++) {
            b.pos[r0[i] + t] = (int32_t)(s->cache.pos + t);
            int im = s->ov_img && s->ov_img[t];
            if (!e->pipe || ds41_pipe_first(e->pipe))   /* --split layers: the first stage's */
                ds41_stream_embed(cfg, w, &b.s, r0[i] + t, tokens[i][t], im ? s->ov_emb + (size_t)t * dim : NULL);
        }
        if (ctx->bd && e->has_engram) ds41_bd_enter(ctx, DS41_BD_ENGRAM, 0);
        int erc = e->has_engram &&
                  engram_ids(e, &s->cache, tokens[i], s->ov_img, T[i], s->cache.pos, b.eg_ids, r0[i], N, hist[i]);
        if (ctx->bd && e->has_engram) ds41_bd_leave(ctx);
        if (erc) {
            rc = ds41_errf(err, "out of memory");
            goto done;
        }
        s->rows_full += (long long)L * T[i];
        for (int l = 0; l < L; l++) s->rows_computed += T[i] - (i == 0 ? qrow[l] : 0);
    }
    /* P4: the step's Engram rows (every sequence's, stacked), read through the first sequence's
     * step; the reads run while the layers before the first Engram layer compute */
    if (e->has_engram) {
        if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_ENGRAM, 0);
        int prc = ds41_engram_prefetch_issue(ss[0], b.eg_ids, N, err);
        if (ctx->bd) ds41_bd_leave(ctx);
        if (prc) { rc = -1; goto done; }
    }

    /* ---- the block loop: layer l on the stacked rows [k0, N) (its attention input and keys)
     * and [q0, N) (its outputs), the bounds of sequence 0's plan; from layer l0 with its input
     * given (a split prefill's decoder half, ds41_seq.from_layer) ---- */
    size_t srow = (size_t)cfg->hc_mult * dim;
    int l0 = count == 1 && ss[0]->from_layer > 0 && ss[0]->from_layer < L ? ss[0]->from_layer : 0;
    if (l0) {
        memcpy(b.s.X, ss[0]->from_X, N * srow * sizeof(float));
        memcpy(b.s.pre, ss[0]->from_pre, N * cfg->hc_mult * sizeof(float));
    }
    for (int i = 0; i < count; i++) ss[i]->stream = &b.s, ss[i]->stream_n = N;
    for (int l = l0; l < L; l++) {
        /* a prefill node (src/pd/) ships a KV source's finished pages while the next layers compute */
        if (l > l0) layer_done(ss, count, l - 1);
        /* --split layers: the stream crosses to the next stage in front of its first layer,
         * and at a cut that is not a KV source what the layers from l on read of the earlier
         * ones (fwd_cut.c) */
        int here = 1;
        if (e->pipe) {
            const ds41_cut_need *nd = ds41_pipe_cut(e->pipe, l);
            size_t sn = ds41_fwd_cut_size(&fs, nd);
            int send = nd && ds41_pipe_holds(e->pipe, l - 1);
            if (sn > cut_cap) {
                uint8_t *nb = realloc(cut_buf, sn);
                if (!nb) { rc = ds41_errf(err, "out of memory for %zu bytes across the cut in front of layer %d", sn, l); goto done; }
                cut_buf = nb;
                cut_cap = sn;
            }
            if (sn && send && ds41_fwd_cut_pack(&fs, nd, cut_buf, err)) { rc = -1; goto done; }
            here = ds41_pipe_layer(e->pipe, b.s.X, b.s.pre, l, (size_t)krow[l], N, cut_buf, sn, err->msg, sizeof err->msg);
            if (here < 0) { rc = -1; goto done; }
            if (sn && !send && ds41_fwd_cut_unpack(&fs, nd, cut_buf, err)) { rc = -1; goto done; }
        }
        if (!here) continue;
        const ds41_layer_plan *lp = &cfg->layers[l];
        const ds41_layer_weights *lw = &w->layers[l];
        size_t k0 = (size_t)krow[l], q0 = (size_t)qrow[l];
        if (e->ra) {   /* --readahead: the next layer's weights (the first forward's layer 0 too) */
            if (l == 0) ds41_engine_readahead(e, 0);
            ds41_engine_readahead(e, l + 1);
        }
        /* a prompt part before the rows this layer's reach starts at, alone: nothing to
         * compute (a KV source has every row) */
        if (k0 == N) continue;

        /* Engram before the block, on the rows of the stream that exist (a given input of
         * layer l0 is the stream after it) */
        if (lp->engram_slot >= 0 && e->has_engram && !(l0 > 0 && l == l0)) {
            if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_ENGRAM, 0);
            int lrc = ds41_engram_layer(ss[0], lw, lp->engram_slot, b.eg_ids + ((size_t)lp->engram_slot * N + k0) * cols,
                                        (int)(N - k0), img ? img + k0 : NULL, b.s.X + k0 * srow, err);
            if (ctx->bd) ds41_bd_leave(ctx);
            if (lrc) {
                rc = -1;
                goto done;
            }
        }
        /* DSpark tap: mean over the copies of the block's input stream */
        int ti = lp->is_dspark_target && mh ? dspark_target_index(cfg, n_tg, l) : -1;
        if (ti >= 0) dspark_tap(ctx, cfg, b.s.X, k0, N, ti, n_tg, mh);

        /* ---- attention sublayer ---- */
        ds41_block_attn_in(ctx, cfg, lw, &b.s, q0, (int)(N - q0), k0, (int)(N - k0));
        double ta = ctx->prof ? ds41_prof_now() : 0.0;
        if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_ATTN, 0);
        int arc = ds41_fwd_attention(&fs, &b, l, (int)k0, (int)q0, lo[l], err);
        if (ctx->bd) ds41_bd_leave(ctx);
        if (arc) { rc = -1; goto done; }
        if (ctx->prof) ctx->prof[DS41_PROF_ATTN] += ds41_prof_now() - ta;
        if (q0 == N) continue;   /* keys only (a prompt part alone) */
        ds41_block_attn_out(ctx, cfg, &b.s, q0, (int)(N - q0));

        /* ---- MoE sublayer (the routed experts through the engine's dispatch, moe.h) ---- */
        for (size_t i = 0; i < N * lp->n_active; i++) b.msel[i] = -1;
        ds41_block_ffn(ctx, cfg, lw, lp, &b.s, q0, (int)(N - q0), b.msel + q0 * lp->n_active);

        for (int i = 0; i < count; i++)
            if (ss[i]->trace)
                ds41_fwd_trace_layer(ss[i]->trace, lp, l, v[i].sp, b.msel + r0[i] * lp->n_active, T[i]);
    }

    layer_done(ss, count, L - 1);
    /* ---- collapse, final norm, head on the rows from h0 (--split layers: the last stage's,
     * shared with every rank) ---- */
    int head_here = !e->pipe || ds41_pipe_last(e->pipe);
    if (count == 1 && N > h0) {
        ds41_seq *s = ss[0];
        float *dst = rows && rows[0] ? rows[0] + h0 * V : s->logits;
        if (head_here && s->verify) {
            /* [verify] the head row by row: the GEMV path decode uses (the multi-row BF16 head
             * is much slower at small T; rows are independent) */
            for (size_t t = h0; t < N; t++) ds41_stream_head(ctx, cfg, w, w->norm, &b.s, t, 1, dst + (t - h0) * V);
        } else if (head_here) {
            ds41_stream_head(ctx, cfg, w, w->norm, &b.s, h0, (int)(N - h0), dst);
        }
        /* --split layers: the rows may arrive later (serve's pipelined step), stay on the last
         * stage (ids after the last stage) or not come here (dist_pipe.h) */
        size_t at = N - 1 - h0;
        int sh = e->pipe ? pipe_share_batch(e->pipe, ss, T, r0, rows, 1, h0, dst, N, V, err) : 0;
        if (sh < 0) { rc = -1; goto done; }
        if (!(sh & DS41_PIPE_NOT_HERE) && dst != s->logits) memcpy(s->logits, dst + at * V, (size_t)V * sizeof(float));
        s->lg_unshared = (sh & DS41_PIPE_UNSHARED) != 0;
    } else if (count > 1 && N > h0) {
        if (head_here) ds41_stream_head(ctx, cfg, w, w->norm, &b.s, h0, (int)(N - h0), lg);
        int sh = e->pipe ? pipe_share_batch(e->pipe, ss, T, r0, rows, count, h0, lg, N, V, err) : 0;
        if (sh < 0) { rc = -1; goto done; }
        for (int i = 0; i < count; i++) {
            if (r0[i] + (size_t)T[i] <= h0) continue;   /* no row of it in the head (a chunk that goes on) */
            ss[i]->lg_unshared = (sh & DS41_PIPE_UNSHARED) != 0;
            if (sh & DS41_PIPE_NOT_HERE) continue;
            if (rows && rows[i]) memcpy(rows[i], lg + (r0[i] - h0) * V, (size_t)T[i] * V * sizeof(float));
            memcpy(ss[i]->logits, lg + (r0[i] + (size_t)T[i] - 1 - h0) * V, (size_t)V * sizeof(float));
        }
    }

    /* ---- commit: position, Engram history, the DSpark rows computed for every target
     * (sequence 0's plan: the last window at least) ---- */
    for (int i = 0; i < count; i++) {
        float *m = NULL;
        if (mh && count == 1) {
            m = mh;
            mh = NULL;
        } else if (mh) {
            m = malloc((size_t)T[i] * n_tg * dim * sizeof(float));
            if (!m) { rc = ds41_errf(err, "out of memory"); goto done; }
            memcpy(m, mh + r0[i] * n_tg * dim, (size_t)T[i] * n_tg * dim * sizeof(float));
        }
        int keep0 = 0;
        for (int k = 0; i == 0 && k < n_tg; k++) {
            int l = cfg->dspark_targets[k];
            if (l >= 0 && l < L && krow[l] > keep0) keep0 = krow[l];
        }
        forward_commit(ss[i], T[i], hist[i], m, keep0);
    }

done:
    if (bp == &own) ds41_fwd_buf_free(&own);
    else if (bp) ds41_fwd_release(bp, &tmp);
    free(v); free(r0); free(layout); free(hist); free(mh); free(cproj); free(iq); free(wt); free(lg); free(img); free(cut_buf);
    for (int i = 0; i < count; i++) ss[i]->ov_emb = NULL, ss[i]->ov_img = NULL, ss[i]->stream = NULL;   /* one forward's */
    return rc;
}

/* One sequence: the batch of one, its row plan from its prefill mode (decode, all-row logits
 * and approximate restores: every row). rows != NULL (ds41_forward_rows): the head on every
 * row. */
static int forward_one(ds41_seq *s, const int32_t *tokens, int T, int want_logits, float *rows, ds41_err *err) {
    const ds41_config *cfg = s->e->cfg;
    int L = cfg->n_layers;
    if (forward_check(s, tokens, T, err)) return -1;
    /* a forward that ends at a layer's keys (s->stop_layer) has no logits: it reads no head */
    if (s->stop_layer > 0) {
        if (rows) return ds41_errf(err, "forward: all-row logits from a forward that stops at layer %d", s->stop_layer);
        want_logits = 0;
    }
    int *qrow = malloc((size_t)L * 3 * sizeof(int));
    if (!qrow) return ds41_errf(err, "out of memory");
    int *krow = qrow + L, *lo = qrow + 2 * L;
    int decode = s->cache.pos > 0 && T == 1;
    ds41_prefill_mode pmode = decode || rows || s->restore == 2 ? DS41_PREFILL_FULL : s->prefill;
    int rc = seq_row_plan(s, pmode, T, want_logits, !rows, qrow, krow, lo, err);
    if (!rc) {
        size_t h0 = rows ? 0 : want_logits ? (size_t)T - 1 : (size_t)T;
        rc = fwd_run(&s, &tokens, &T, rows ? &rows : NULL, 1, qrow, krow, lo, h0, err);
    }
    free(qrow);
    return rc;
}

int ds41_forward(ds41_seq *s, const int32_t *tokens, int T, int want_logits, ds41_err *err) {
    return forward_one(s, tokens, T, want_logits, NULL, err);
}

int ds41_forward_rows(ds41_seq *s, const int32_t *tokens, int T, float *rows, ds41_err *err) {
    if (!rows) return ds41_errf(err, "forward: no output buffer for the logits rows");
    return forward_one(s, tokens, T, 1, rows, err);
}

int ds41_forward_batch(ds41_seq *const *ss, const int32_t *const *tokens, const int *T, float *const *rows, int count,
                       ds41_err *err) {
    if (count < 1) return 0;
    ds41_engine *e = ss[0]->e;
    int L = e->cfg->n_layers;
    for (int i = 0; i < count; i++) {
        ds41_seq *s = ss[i];
        if (s->e != e) return ds41_errf(err, "batch: sequence %d belongs to another engine", i);
        if (forward_check(s, tokens[i], T[i], err)) return -1;
        int prefill = T[i] > 1 && !s->verify;
        if (prefill && i > 0)
            return ds41_errf(err, "batch: sequence %d feeds a prefill chunk of %d rows (only sequence 0 may)", i, T[i]);
        if (prefill && (s->restore || s->prefill == DS41_PREFILL_REPLAY))
            return ds41_errf(err, "batch: sequence 0's chunk is a restore or replay prefill (ds41_forward runs those)");
        if (prefill && rows && rows[0]) return ds41_errf(err, "batch: no all-row logits for a prefill chunk");
        if (s->cache.pos < 1 && !prefill)
            return ds41_errf(err, "batch: sequence %d holds no tokens (a decode or verify row needs a prompt)", i);
        if (s->restore) return ds41_errf(err, "batch: sequence %d is a prefix-cache replay (ds41_forward runs those)", i);
        for (int j = 0; j < i; j++)
            if (ss[j] == s) return ds41_errf(err, "batch: sequence %d appears twice", i);
    }
    /* the prefill chunk's row plan (CED as ds41_forward with logits; the others every row); a
     * part of a prompt that goes on (plan_ahead > 0) wants no logits: its plan reaches from the
     * prompt's end, and its rows may stop short of the last layers */
    int chunk = T[0] > 1 && !ss[0]->verify;
    int *qrow = calloc((size_t)L * 3, sizeof(int));
    if (!qrow) return ds41_errf(err, "out of memory");
    int *krow = qrow + L, *lo = qrow + 2 * L;
    int chunk_logits = chunk && ss[0]->plan_ahead == 0;
    int rc = chunk ? seq_row_plan(ss[0], ss[0]->prefill, T[0], 1, 1, qrow, krow, lo, err) : 0;
    /* the head runs on the chunk's last row (when it wants logits) and every row after it */
    size_t h0 = chunk ? (size_t)T[0] - (chunk_logits ? 1 : 0) : 0;
    if (!rc) rc = fwd_run(ss, tokens, T, rows, count, qrow, krow, lo, h0, err);
    free(qrow);
    return rc;
}

/* ====================================================================== verify (spec.c) */

int ds41_ik_owner_after(const ds41_config *cfg, int owner, long long P, long long p, int upto_layer) {
    for (long long q = P; q <= p; q++) {
        int last = q == p ? upto_layer : cfg->n_layers - 1;
        for (int l = 0; l <= last && l < cfg->n_layers; l++) {
            const ds41_layer_plan *lp = &cfg->layers[l];
            if (lp->is_kv_source && lp->ratio > 0 && (q + 1) % lp->ratio == 0) owner = l;
        }
    }
    return owner;
}
