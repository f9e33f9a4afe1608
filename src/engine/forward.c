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
 * KV list of one layer (spec 3.11, docs/conformance.md), as a ds41_kvset:
 *   one-shot (P = 0):   [chunk keys (row = position) ; compressed entries]
 *   extend (P > 0, T>1): [ring before the chunk (slot order) ; chunk keys ; compressed]
 *   decode (T = 1):     [ring after writing slot P mod window ; compressed]
 * "compressed" holds only the main-KV entries some query of the layer lists (gather_kv),
 * dequantized from the store's records; the lists are renumbered to match.
 *
 * Batches (ds41_forward_batch): the decode rows and verify blocks of many sequences stacked
 * into one forward. Every projection runs once over the stacked rows; what reads or writes a
 * sequence's state runs per sequence on its view of the stacked buffers (compressor_emit,
 * indexer_select, attend, ring_store: the functions the single-sequence attention() calls).
 *
 * Scratch: ds41_seq.scratch owns the sequence's indexer buffers (seq_part) and the row buffers
 * of short forwards, grown when needed; a decode step allocates little. */
#include "forward.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "formats.h"
#include "mhc.h"
#include "moe.h"

/* LAYOUT_VERIFY (speculative verification, spec.c, docs/speculative.md): a multi-token forward
 * at P > 0 whose every row sees exactly the KV list of a single-token decode at its position. */
enum { LAYOUT_ONESHOT, LAYOUT_EXTEND, LAYOUT_DECODE, LAYOUT_VERIFY };

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
    for (int i = 0; i < e->n_ropes; i++) ds41_rope_free(&e->ropes[i]);
    free(e->layer_rope);
    free(e->token_map);
    if (e->ctx.pool) ds41_pool_destroy(e->ctx.pool);
    ds41_side_destroy(e->side);
    ds41_readahead_free(e->ra);
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

static void seq_scratch_free(ds41_seq *s);

void ds41_seq_free(ds41_seq *s) {
    seq_scratch_free(s);
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

void ds41_stream_embed(const ds41_config *cfg, const ds41_weights *w, ds41_stream *b, size_t t, int32_t tok) {
    int hc = cfg->hc_mult, dim = cfg->dim;
    const uint16_t *er = w->embed + (size_t)tok * dim;
    for (int c = 0; c < hc; c++) {
        float *xr = b->X + (t * hc + c) * dim;
        for (int d = 0; d < dim; d++) xr[d] = ds41_bf16_to_f32(er[d]);
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
    ds41_moe(ctx, cfg, lw, lp, b->xa + r0 * dim, n, NULL, b->y + r0 * dim, msel);
    ds41_hc_apply_post(ctx, b->y + r0 * dim, b->X2 + r0 * sr, b->f_post + r0 * hc, b->f_C + r0 * hc * hc, n, (int)hc,
                       (int)dim, b->X + r0 * sr);
    memcpy(b->pre + r0 * hc, b->f_pre + r0 * hc, (size_t)n * hc * sizeof(float));
}

void ds41_stream_head(const ds41_ctx *ctx, const ds41_config *cfg, const ds41_weights *w, const uint16_t *norm,
                      ds41_stream *b, size_t r0, int n, float *logits) {
    size_t hc = (size_t)cfg->hc_mult, dim = (size_t)cfg->dim;
    ds41_hc_apply_pre(ctx, b->X + r0 * hc * dim, b->pre + r0 * hc, n, (int)hc, (int)dim, b->xin + r0 * dim);
    ds41_rmsnorm(ctx, b->xin + r0 * dim, norm, n, (int)dim, cfg->norm_eps, b->xa + r0 * dim);
    ds41_bf16w head = { w->head, cfg->vocab_size, cfg->dim };
    ds41_linear_bf16(ctx, &head, b->xa + r0 * dim, n, logits, 0);
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
    int last_src = -1;
    for (int l = 0; l < L; l++) if (cfg->layers[l].is_kv_source) last_src = l;
    if (mode == DS41_PREFILL_KVONLY) q = T;
    for (int l = L - 1; l >= 0; l--) {
        const ds41_layer_plan *lp = &cfg->layers[l];
        if (mode == DS41_PREFILL_KVONLY && l > last_src) {   /* nothing a KV source reads */
            qrow[l] = krow[l] = T;
            continue;
        }
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

/* The sequence's part of a forward's scratch: what its indexers and attention keep between
 * layers (index keys, top-k lists, candidate pool) and the indexer's temporaries. Owned by the
 * sequence (ds41_seq.scratch) and grown when a forward needs more, so a decode step allocates
 * none of it; seq_part_begin marks everything stale at the start of a forward. */
typedef struct seq_part {
    int n_layers, n_stores;
    int32_t **sel;        /* per layer: top-k lists [T, sel_w] (index sources) */
    size_t *sel_cap;      /* ints held */
    int *sel_w;
    uint8_t *pool;        /* candidate pool [T, nb] of the candidate source */
    size_t pool_cap;
    int pool_nb;
    float *scores;        /* indexer: [E] scores, [2E + 8] top-k scratch, [k] chosen */
    int *iscr, *chosen;
    size_t scores_cap, iscr_cap, chosen_cap;
} seq_part;

typedef struct fwd_buf {
    ds41_stream s;        /* the residual stream of the T rows */
    float *kc;
    uint8_t *rec;
    float *cq, *q, *o, *wos;
    float *ringf;
    int32_t *list;
    int *msel;
    int32_t *pos;
    int64_t *eg_ids;      /* [n_eg][T][cols] */
    float *gkv;           /* main-KV rows one layer's queries list, dequantized [n_gather, head_dim] */
    int32_t *gmap;        /* per entry j: its row in gkv + 1, 0 = not gathered (zero between layers) */
    int32_t *gent;        /* per gathered row: its entry, to clear gmap afterwards */
    seq_part *sp;         /* the sequence's part (not owned) */
    const uint8_t **grec; /* P2: per gathered row its packed record (read by the attention kernel) */
} fwd_buf;

static int eg_cols(const ds41_config *cfg) {
    return cfg->n_engram_layers > 0 ? (cfg->engram_max_ngram - 1) * cfg->engram_n_heads : 0;
}

static void *zalloc(size_t n, size_t sz, int *fail) {
    if (*fail) return NULL;
    void *p = calloc(n ? n : 1, sz);
    if (!p) *fail = 1;
    return p;
}

static void seq_part_free(seq_part *p) {
    if (p->sel) for (int l = 0; l < p->n_layers; l++) free(p->sel[l]);
    free(p->sel); free(p->sel_cap); free(p->sel_w); free(p->pool);
    free(p->scores); free(p->iscr); free(p->chosen);
    memset(p, 0, sizeof *p);
}

static int seq_part_init(seq_part *p, int n_layers, int n_stores) {
    memset(p, 0, sizeof *p);
    p->n_layers = n_layers;
    p->n_stores = n_stores;
    p->sel = calloc((size_t)n_layers + 1, sizeof(int32_t *));
    p->sel_cap = calloc((size_t)n_layers + 1, sizeof(size_t));
    p->sel_w = calloc((size_t)n_layers + 1, sizeof(int));
    if (p->sel && p->sel_cap && p->sel_w) return 0;
    seq_part_free(p);
    return -1;
}

/* A forward starts: nothing of an earlier one is valid. */
static void seq_part_begin(seq_part *p) {
    memset(p->sel_w, 0, ((size_t)p->n_layers + 1) * sizeof(int));
    p->pool_nb = 0;
}

/* *buf holds at least n elements of size sz (grown to max(n, 2 x its size); contents lost). */
static int grow(void **buf, size_t *cap, size_t n, size_t sz) {
    if (n <= *cap && *buf) return 0;
    size_t c = n > 2 * *cap ? n : 2 * *cap;
    if (c < 1) c = 1;
    void *p = malloc(c * sz);
    if (!p) return -1;
    free(*buf);
    *buf = p;
    *cap = c;
    return 0;
}

static void buf_free(fwd_buf *b) {
    ds41_stream_free(&b->s);
    free(b->kc); free(b->rec); free(b->cq); free(b->q); free(b->o); free(b->wos); free(b->ringf);
    free(b->list); free(b->msel); free(b->pos); free(b->eg_ids);
    free(b->gkv); free(b->gmap); free(b->gent); free(b->grec);
    memset(b, 0, sizeof *b);
}

static int store_index(const ds41_cache *c, int layer) {
    for (int i = 0; i < c->n_stores; i++) if (c->stores[i].layer == layer) return i;
    return -1;
}

/* The index keys of store si as the indexer reads them: its packed records, in place (the
 * scores take integer dots on the E2M1 codes, ds41_indexer_scores_packed), so nothing is
 * dequantized or copied and a rollback, reset or restore is seen at once. */
static ds41_ik_keys store_ik_keys(const ds41_kv_store *st) {
    ds41_ik_keys k = { (const uint8_t *const *)st->pages, st->per_page, (size_t)st->per_page * st->kv_bytes, st->ik_bytes };
    return k;
}

/* The compressed entries that query rows [q0, T) list in csel [T, kc_w] (-1 = none),
 * dequantized once each into b->gkv in order of first appearance; b->gmap[j] - 1 is entry
 * j's row there. Sparse attention reads rows only through the list, so the renumbered list
 * gives exactly the values of the whole-store layout, at index_topk entries per query instead
 * of every entry. Returns the number of rows; clear_gather resets the map. */
static int gather_kv(const ds41_config *cfg, fwd_buf *b, ds41_kv_store *st, const int32_t *csel, int kc_w, int q0,
                     int T, int packed) {
    int D = cfg->head_dim, n = 0;
    for (size_t i = (size_t)q0 * kc_w; i < (size_t)T * kc_w; i++) {
        int32_t j = csel[i];
        if (j < 0 || j >= st->n_entries || b->gmap[j]) continue;   /* not held: read as empty, as -1 */
        /* P2: only the record's address; the attention kernel decodes it where it reads it */
        if (packed) b->grec[n] = ds41_store_kv_rec(st, j, 0, NULL);
        else ds41_kv_rec_unpack(cfg, ds41_store_kv_rec(st, j, 0, NULL), 1, b->gkv + (size_t)n * D);
        b->gent[n++] = j;
        b->gmap[j] = n;
    }
    return n;
}

static void clear_gather(fwd_buf *b, int n) {
    for (int i = 0; i < n; i++) b->gmap[b->gent[i]] = 0;
}

static void trace_i32(FILE *f, const int32_t *v, size_t n) {
    if (f) fwrite(v, sizeof(int32_t), n, f);
}

/* The conformance trace of layer l (docs/conformance.md): the top-k lists of an index source
 * and the chosen experts of every row, each after a [T, width] header. */
static void trace_layer(ds41_trace *tr, const ds41_layer_plan *lp, int l, const fwd_buf *b, int T) {
    if (lp->is_index_source && tr->topk && tr->topk[l]) {
        int32_t hdr[2] = { T, b->sp->sel_w[l] };
        trace_i32(tr->topk[l], hdr, 2);
        if (b->sp->sel[l]) trace_i32(tr->topk[l], b->sp->sel[l], (size_t)T * b->sp->sel_w[l]);
    }
    if (tr->experts && tr->experts[l]) {
        int32_t hdr[2] = { T, lp->n_active };
        trace_i32(tr->experts[l], hdr, 2);
        trace_i32(tr->experts[l], b->msel, (size_t)T * lp->n_active);
    }
}

static int compressor_emit(ds41_seq *s, int l, float *kv, const float *sc, int T, long long P, int layout,
                           ds41_err *err);

/* The compressor of KV-source layer l over the rows of this forward (all rows are computed
 * for a KV source), writing its new entries into the store. Returns entries emitted or -1. */

/* P1 (ratio 1): the fused compressor of attention.c writes the T records in place. */
static int run_compressor_fused(ds41_seq *s, int l, const float *xa, int T, long long P, ds41_err *err) {
    ds41_engine *e = s->e;
    ds41_kv_store *st = ds41_cache_store(&s->cache, l);
    uint8_t **rp = malloc((size_t)T * 2 * sizeof(uint8_t *));
    if (!rp) return ds41_errf(err, "out of memory in the compressor of layer %d", l);
    for (int t = 0; t < T; t++) {
        rp[t] = ds41_store_ik_rec(st, P + t, 1, err);
        rp[T + t] = ds41_store_kv_rec(st, P + t, 1, err);
        if (!rp[t] || !rp[T + t]) { free(rp); return -1; }
    }
    ds41_compress_r1_fused(&e->ctx, e->cfg, &e->w->layers[l], &e->ropes[e->layer_rope[l]], xa, T, P, rp, rp + T);
    free(rp);
    st->n_entries = P + T;
    return T;
}

static int run_compressor(ds41_seq *s, int l, const float *xa, int T, long long P, int layout, ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_weights *lw = &e->w->layers[l];
    int D = cfg->head_dim, r = ds41_cache_store(&s->cache, l)->ratio;
    if (r == 1 && !(e->ctx.ablate & DS41_ABLATE_P1)) return run_compressor_fused(s, l, xa, T, P, err);
    float *c = malloc((size_t)T * D * sizeof(float) * (r > 1 ? 2 : 1));
    if (!c) return ds41_errf(err, "out of memory in the compressor of layer %d", l);
    if (r == 1) ds41_compress_r1(&e->ctx, cfg, lw, xa, T, c);
    else ds41_compress_proj(&e->ctx, cfg, lw, xa, T, c, c + (size_t)T * D);
    int emitted = compressor_emit(s, l, c, r == 1 ? NULL : c + (size_t)T * D, T, P, layout, err);
    free(c);
    return emitted;
}

/* The compressor's per-sequence part over its T rows' projections (ratio 1: the latents
 * kv [T, head_dim], modified by RoPE; ratio r > 1: kv and sc [T, head_dim]): pooling, the
 * entries' records, the state rows. Returns entries emitted or -1. */
static int compressor_emit(ds41_seq *s, int l, float *kv, const float *sc, int T, long long P, int layout,
                           ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_weights *lw = &e->w->layers[l];
    const ds41_rope *rope = &e->ropes[e->layer_rope[l]];
    ds41_kv_store *st = ds41_cache_store(&s->cache, l);
    int D = cfg->head_dim, r = st->ratio, emitted = 0;
    if (r == 1) {
        for (int t = 0; t < T; t++) {
            long long j = P + t;
            uint8_t *kr = ds41_store_kv_rec(st, j, 1, err), *ir = ds41_store_ik_rec(st, j, 1, err);
            if (!kr || !ir) return -1;
            ds41_compress_entry(&e->ctx, cfg, lw, rope, kv + (size_t)t * D, (int)(j * r), ir, kr);
            emitted++;
        }
    } else {
        ds41_comp_state *cs = ds41_cache_comp(&s->cache, l);
        /* the groups complete in this forward: group (p+1)/r - 1 is complete at p, members
         * p-r+1 .. p, from the state for positions before this forward, from this forward's
         * rows otherwise */
        int ng = 0;
        for (int t = 0; t < T; t++) ng += (P + t + 1) % r == 0;
        int fused = !(e->ctx.ablate & DS41_ABLATE_P1);
        const float **rows = malloc(((size_t)ng * r * 2 + 1) * sizeof(float *));
        uint8_t **recs = malloc(((size_t)ng * 2 + 1) * sizeof(uint8_t *));
        int *gpos = malloc(((size_t)ng + 1) * sizeof(int));
        float *one = malloc((size_t)D * sizeof(float));
        if (!rows || !recs || !gpos || !one) {
            free(rows); free(recs); free(gpos); free(one);
            return ds41_errf(err, "out of memory in the compressor of layer %d", l);
        }
        const float **kvr = rows, **scr = rows + (size_t)ng * r;
        uint8_t **krs = recs, **irs = recs + ng;
        int g = 0;
        for (int t = 0; t < T; t++) {
            long long p = P + t;
            if ((p + 1) % r) continue;
            for (int i = 0; i < r; i++) {
                long long m = p - r + 1 + i;
                size_t k = (size_t)g * r + i;
                if (m >= P) { kvr[k] = kv + (size_t)(m - P) * D; scr[k] = sc + (size_t)(m - P) * D; }
                else { kvr[k] = cs->kv + (size_t)(m % r) * D; scr[k] = cs->sc + (size_t)(m % r) * D; }
            }
            long long j = p / r;
            krs[g] = ds41_store_kv_rec(st, j, 1, err);
            irs[g] = ds41_store_ik_rec(st, j, 1, err);
            gpos[g] = (int)(j * r);
            if (!krs[g] || !irs[g]) { free(rows); free(recs); free(gpos); free(one); return -1; }
            /* P1 off: the separate steps, group by group */
            if (!fused) {
                ds41_compress_pool(&e->ctx, cfg, lw, kvr + (size_t)g * r, scr + (size_t)g * r, r, one);
                ds41_compress_entry(&e->ctx, cfg, lw, rope, one, gpos[g], irs[g], krs[g]);
            }
            g++;
        }
        /* P1 (ratio r): pooling fused with the entries' norm, index keys and records, per tile */
        if (fused && ng > 0)
            ds41_compress_pool_fused(&e->ctx, cfg, lw, rope, kvr, scr, r, ng, gpos, irs, krs);
        emitted = ng;
        free(rows); free(recs); free(gpos); free(one);
        /* State rows: decode writes its token's row every step (the reference's decode);
         * a multi-token forward stores the rows of the trailing incomplete group (the
         * reference's prefill remainder), which is all a later forward can read. */
        long long end = P + T, cut = (end / r) * r;
        for (int t = 0; t < T; t++) {
            long long p = P + t;
            if (layout == LAYOUT_DECODE || layout == LAYOUT_VERIFY || p >= cut) {
                memcpy(cs->kv + (size_t)(p % r) * D, kv + (size_t)t * D, (size_t)D * sizeof(float));
                memcpy(cs->sc + (size_t)(p % r) * D, sc + (size_t)t * D, (size_t)D * sizeof(float));
            }
        }
        /* [verify] log every row's projections: a rollback rebuilds the decode state from them */
        ds41_spec_log *lg = &s->cache.spec;
        if (s->verify && lg->cap >= T) {   /* also a 1-row verify (decode layout) */
            size_t ci = (size_t)(cs - s->cache.comp);
            memcpy(lg->kv[ci], kv, (size_t)T * D * sizeof(float));
            memcpy(lg->sc[ci], sc, (size_t)T * D * sizeof(float));
            lg->n = T;
        }
    }
    st->n_entries = (P + T) / r;
    return emitted;
}

/* [restore] The compressor of KV source l in a prefix-cache replay: its entries up to P + T are
 * already in the store (restored pages), so nothing is computed; returns the number it would
 * have emitted (the published index-K owner moves as in the forward it replays). */
static int restored_entries(ds41_seq *s, int l, int T, long long P, ds41_err *err) {
    ds41_kv_store *st = ds41_cache_store(&s->cache, l);
    long long r = st->ratio, want = (P + T) / r;
    if (st->n_entries < want)
        return ds41_errf(err, "replay: layer %d holds %lld restored entries, positions up to %lld need %lld", l,
                         st->n_entries, P + T - 1, want);
    return (int)(want - P / r);
}
static int indexer_select(const ds41_ctx *ctx, ds41_seq *s, fwd_buf *b, int l, int q0, int T, long long P,
                          const float *iq, const float *wt, ds41_err *err);

/* The indexer of index-source layer l on query rows [q0, T); fills b->sel[l]. ctx: the
 * engine's, or (P6, on the side worker) a copy without the thread pool. */
static int run_indexer(const ds41_ctx *ctx, ds41_seq *s, fwd_buf *b, int l, int q0, int T, long long P, const float *xa,
                       ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    int nq = T - q0, NH = cfg->index_n_heads, ID = cfg->index_head_dim;
    float *iq = malloc(((size_t)nq * NH * ID + 1) * sizeof(float));
    float *wt = malloc(((size_t)nq * NH + 1) * sizeof(float));
    if (!iq || !wt) { free(iq); free(wt); return ds41_errf(err, "out of memory in the indexer of layer %d", l); }
    if (nq > 0)
        ds41_indexer_query(ctx, cfg, &e->w->layers[l], &e->ropes[e->layer_rope[l]], b->cq + (size_t)q0 * cfg->q_lora_rank,
                           xa + (size_t)q0 * cfg->dim, nq, b->pos + q0, iq, wt);
    int rc = indexer_select(ctx, s, b, l, q0, T, P, iq, wt, err);
    free(iq);
    free(wt);
    return rc;
}

/* The indexer's per-sequence part: scores of query rows [q0, T) (queries iq, weights wt of
 * those rows) against the sequence's index keys, candidate pool, top-k into b->sel[l]. */
static int indexer_select(const ds41_ctx *ctx, ds41_seq *s, fwd_buf *b, int l, int q0, int T, long long P,
                          const float *iq, const float *wt, ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_plan *lp = &cfg->layers[l];
    int r = lp->ratio, NH = cfg->index_n_heads, ID = cfg->index_head_dim;
    long long E = (P + T) / r;
    int k = (int)(E < cfg->index_topk ? E : cfg->index_topk);
    seq_part *sp = b->sp;
    if (grow((void **)&sp->sel[l], &sp->sel_cap[l], (size_t)T * (k ? k : 1), sizeof(int32_t)))
        return ds41_errf(err, "out of memory in the indexer of layer %d", l);
    sp->sel_w[l] = k;
    for (size_t i = 0; i < (size_t)T * k; i++) sp->sel[l][i] = -1;
    if (k == 0) return 0;
    /* which index-K cache: own (default) or the published pointer (official, 10.1) */
    int src = lp->index_k_source;
    if (s->index_k_official && s->cache.ik_owner >= 0) src = s->cache.ik_owner;
    int si = store_index(&s->cache, src);
    /* [verify] official reading: each row reads the cache a decode at its position would */
    int vofficial = s->verify && P > 0 && T > 1 && s->index_k_official;
    if (!vofficial && (si < 0 || s->cache.stores[si].n_entries < E))
        return ds41_errf(err, "layer %d: index-K cache of layer %d holds %lld entries, need %lld", l, src,
                         si < 0 ? 0LL : s->cache.stores[si].n_entries, E);
    if (grow((void **)&sp->scores, &sp->scores_cap, (size_t)E, sizeof(float)) ||
        grow((void **)&sp->iscr, &sp->iscr_cap, (size_t)E * 2 + 8, sizeof(int)) ||
        grow((void **)&sp->chosen, &sp->chosen_cap, (size_t)k, sizeof(int)))
        return ds41_errf(err, "out of memory in the indexer of layer %d", l);
    float *scores = sp->scores;
    int *scratch = sp->iscr, *chosen = sp->chosen;
    int B = cfg->candidate_block_size > 0 ? cfg->candidate_block_size : 1;
    int nb = (int)((E + B - 1) / B);
    if (lp->is_candidate_source) {
        if (grow((void **)&sp->pool, &sp->pool_cap, (size_t)T * nb, 1)) return ds41_errf(err, "out of memory");
        memset(sp->pool, 0, (size_t)T * nb);
        sp->pool_nb = nb;
    }
    for (int t = q0; t < T; t++) {
        long long p = P + t;
        long long n_p = (p + 1) / r;
        if (n_p > E) n_p = E;
        if (vofficial) {
            int osrc = ds41_ik_owner_after(cfg, s->ik_owner0, P, p, l), ssi;
            if (osrc < 0) osrc = lp->index_k_source;
            ssi = store_index(&s->cache, osrc);
            if (ssi < 0 || s->cache.stores[ssi].n_entries < n_p) {
                return ds41_errf(err, "layer %d: verify row %lld needs %lld index keys of layer %d", l, p, n_p, osrc);
            }
            ds41_ik_keys keys = store_ik_keys(&s->cache.stores[ssi]);
            ds41_indexer_scores_packed(ctx, cfg, iq + (size_t)(t - q0) * NH * ID, wt + (size_t)(t - q0) * NH, &keys,
                                       (int)n_p, (int)n_p, scores);
            for (long long j = n_p; j < E; j++) scores[j] = -INFINITY;
        } else {
            ds41_ik_keys keys = store_ik_keys(&s->cache.stores[si]);
            ds41_indexer_scores_packed(ctx, cfg, iq + (size_t)(t - q0) * NH * ID, wt + (size_t)(t - q0) * NH, &keys,
                                       (int)E, (int)n_p, scores);
        }
        if (lp->is_candidate_source)
            ds41_candidate_blocks(cfg, scores, (int)E, (int)n_p, sp->pool + (size_t)t * nb, scratch);
        if (lp->uses_candidates && sp->pool && sp->pool_nb == nb) {
            const uint8_t *keep = sp->pool + (size_t)t * nb;
            for (long long j = 0; j < E; j++) if (!keep[j / B]) scores[j] = -INFINITY;
        }
        ds41_topk(scores, (int)E, k, chosen, scratch);
        for (int i = 0; i < k; i++) sp->sel[l][(size_t)t * k + i] = chosen[i] >= n_p ? -1 : chosen[i];
    }
    return 0;
}

static int attend(ds41_seq *s, fwd_buf *b, int l, int q0, int lo, int T, long long P, int layout, ds41_err *err);
static void ring_store(ds41_seq *s, fwd_buf *b, int l, int k0, int T, long long P, int layout);

/* P6: the indexer of a layer overlapped with the query projection. After cq (wq_a + norm), the
 * indexer (its query projection, the scores, the candidate pool, top-k) needs only cq and the
 * layer input, and q (wq_b, the layer's largest projection at production width, + RoPE) only
 * cq: the indexer runs on the engine's side worker, single-threaded, while the caller computes
 * q with its pool; then the caller waits. Every result is what the serial order computes (the
 * kernels' results do not depend on the thread count). */
typedef struct ix_job {
    ds41_ctx ctx;             /* the engine's without the pool */
    ds41_seq *s;
    fwd_buf *b;
    int l, q0, T;
    long long P;
    const float *xa;
    int rc;
    double seconds;
    ds41_err err;
} ix_job;

/* The context a side task runs with: the engine's kernels, one thread, no timers. */
static ds41_ctx side_ctx(const ds41_ctx *c) {
    ds41_ctx x = *c;
    x.pool = NULL;
    x.n_threads = 1;
    x.prof = NULL;
    return x;
}

static void ix_run(void *arg) {
    ix_job *j = arg;
    double t0 = ds41_prof_now();
    j->rc = run_indexer(&j->ctx, j->s, j->b, j->l, j->q0, j->T, j->P, j->xa, &j->err);
    j->seconds = ds41_prof_now() - t0;
}

/* The query path of layer l on rows [q0, T) of b with the indexer (index sources) beside it. */
static int query_and_indexer(ds41_seq *s, fwd_buf *b, int l, int q0, int T, long long P, ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_plan *lp = &cfg->layers[l];
    const ds41_layer_weights *lw = &e->w->layers[l];
    const ds41_rope *rope = &e->ropes[e->layer_rope[l]];
    const ds41_ctx *ctx = &e->ctx;
    int nq = T - q0, HD = cfg->n_heads * cfg->head_dim;
    float *cq = b->cq + (size_t)q0 * cfg->q_lora_rank, *q = b->q + (size_t)q0 * HD;
    ds41_attn_query_c(ctx, cfg, lw, b->s.xa + (size_t)q0 * cfg->dim, nq, cq);
    if (!lp->is_index_source) {
        ds41_attn_query_q(ctx, cfg, lw, rope, cq, nq, b->pos + q0, q);
        return 0;
    }
    ix_job j = { side_ctx(ctx), s, b, l, q0, T, P, b->s.xa, 0, 0.0, { { 0 } } };
    int side = !(ctx->ablate & DS41_ABLATE_P6) && ds41_side_start(e->side, ix_run, &j) == 0;
    if (!side) {
        double t0 = ctx->prof ? ds41_prof_now() : 0.0;
        j.rc = run_indexer(ctx, s, b, l, q0, T, P, b->s.xa, &j.err);
        if (ctx->prof) ctx->prof[DS41_PROF_INDEXER] += ds41_prof_now() - t0;
    }
    ds41_attn_query_q(ctx, cfg, lw, rope, cq, nq, b->pos + q0, q);
    if (side) {
        ds41_side_wait(e->side);
        if (ctx->prof) ctx->prof[DS41_PROF_INDEXER] += j.seconds;   /* its own time, overlapped */
    }
    if (j.rc) { *err = j.err; return -1; }
    return 0;
}

/* Attention sublayer of layer l (spec 3.5-3.13): x rows [k0, T) in b->s.xa; output rows
 * [q0, T) into b->s.y (at row offset q0). */
static int attention(ds41_seq *s, fwd_buf *b, int l, int k0, int q0, int lo, int T, long long P, int layout, ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_plan *lp = &cfg->layers[l];
    const ds41_layer_weights *lw = &e->w->layers[l];
    const ds41_rope *rope = &e->ropes[e->layer_rope[l]];
    const ds41_ctx *ctx = &e->ctx;
    int D = cfg->head_dim, HD = cfg->n_heads * cfg->head_dim, rb = ds41_swa_rec_bytes(cfg);
    int nk = T - k0, nq = T - q0;

    /* SWA keys of rows [k0, T) */
    ds41_attn_swa_k(ctx, cfg, lw, rope, b->s.xa + (size_t)k0 * cfg->dim, nk, b->pos + k0, b->kc + (size_t)k0 * D,
                    b->rec + (size_t)k0 * rb);

    /* compressor: new entries of this forward, published for the indexers and attention */
    double t0 = ctx->prof ? ds41_prof_now() : 0.0;
    if (lp->is_kv_source) {
        int em = s->restore ? restored_entries(s, l, T, P, err) : run_compressor(s, l, b->s.xa, T, P, layout, err);
        if (em < 0) return -1;
        if (em > 0) s->cache.ik_owner = l;
        if (ctx->prof) ctx->prof[DS41_PROF_COMPRESS] += ds41_prof_now() - t0;
    }

    if (nq > 0 && query_and_indexer(s, b, l, q0, T, P, err)) return -1;

    /* KV set, lists and sparse attention into b->o */
    if (ctx->prof) t0 = ds41_prof_now();
    if (attend(s, b, l, q0, lo, T, P, layout, err)) return -1;
    if (ctx->prof) ctx->prof[DS41_PROF_SPARSE] += ds41_prof_now() - t0;
    if (nq > 0)
        ds41_attn_output(ctx, cfg, lw, rope, b->o + (size_t)q0 * HD, nq, b->pos + q0, b->wos,
                         b->s.y + (size_t)q0 * cfg->dim);
    ring_store(s, b, l, k0, T, P, layout);
    return 0;
}

/* The per-sequence middle of the attention sublayer: the KV set of layer l (ring, chunk keys,
 * gathered compressed entries), every query row's list (docs/conformance.md), and the sparse
 * attention of rows [q0, T) into b->o. Decode writes its ring slot first. */
static int attend(ds41_seq *s, fwd_buf *b, int l, int q0, int lo, int T, long long P, int layout, ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_plan *lp = &cfg->layers[l];
    const ds41_layer_weights *lw = &e->w->layers[l];
    const ds41_ctx *ctx = &e->ctx;
    int D = cfg->head_dim, HD = cfg->n_heads * cfg->head_dim, W = cfg->window, rb = ds41_swa_rec_bytes(cfg);
    int nq = T - q0;
    ds41_ring *ring = &s->cache.rings[l];
    ds41_kvset kv;
    memset(&kv, 0, sizeof kv);
    int np = 0, chunk_off = 0, ring_rows = 0;
    if (layout == LAYOUT_DECODE) {
        memcpy(ds41_ring_slot(ring, P), b->rec, (size_t)rb);
        ds41_swa_rec_unpack(cfg, ring->rec, W, b->ringf);
        kv.part[np] = b->ringf; kv.n[np++] = W;
        ring_rows = W;
    } else if (layout == LAYOUT_EXTEND || layout == LAYOUT_VERIFY) {
        ds41_swa_rec_unpack(cfg, ring->rec, W, b->ringf);
        kv.part[np] = b->ringf; kv.n[np++] = W;
        ring_rows = W;
        chunk_off = W;
        kv.part[np] = b->kc; kv.n[np++] = T;
    } else {
        kv.part[np] = b->kc; kv.n[np++] = T;
    }
    int comp_off = ring_rows + (layout == LAYOUT_DECODE ? 0 : T);
    int kc_w = 0, n_gather = 0;
    const int32_t *csel = NULL;
    if (lp->ratio > 0 && lp->topk_source >= 0) {
        int si = store_index(&s->cache, lp->kv_source);
        if (si < 0) return ds41_errf(err, "layer %d: KV source %d has no entries in this forward", l, lp->kv_source);
        kc_w = b->sp->sel_w[lp->topk_source];
        csel = b->sp->sel[lp->topk_source];
        if (kc_w > 0 && !csel) return ds41_errf(err, "layer %d: top-k source %d produced no lists", l, lp->topk_source);
        int packed = !(ctx->ablate & DS41_ABLATE_P2);
        if (kc_w > 0) n_gather = gather_kv(cfg, b, &s->cache.stores[si], csel, kc_w, q0, T, packed);
        if (packed) kv.rec[np] = b->grec;
        else if (ctx->prof) ctx->prof[DS41_PROF_KVBYTES] += (double)n_gather * (ds41_kv_rec_bytes(cfg) + D * 4);
        kv.part[np] = b->gkv; kv.n[np++] = n_gather;
    }
    int Wsw = layout == LAYOUT_DECODE || layout == LAYOUT_VERIFY ? W : ds41_swa_width(cfg, P, T);
    int Lw = Wsw + kc_w;
    for (int t = q0; t < T; t++) {
        int32_t *li = b->list + (size_t)(t - q0) * Lw;
        long long p = P + t;
        if (layout == LAYOUT_DECODE) {
            ds41_swa_list_decode(cfg, P, li);
        } else if (layout == LAYOUT_VERIFY) {
            /* [verify] the decode list at p: ring slots oldest -> newest, o = (p+1) mod W; the
             * position in slot `sl` is the q <= p with q = sl mod W; q < 0 -> -1 (the leading
             * -1s of a ring not yet full); q >= P comes from the chunk (a later verify row's key
             * is never listed), q < P from the ring as it was before the forward */
            for (int i = 0; i < W; i++) {
                int sl = (int)((p + 1 + i) % W);
                long long qpos = p - (((p - sl) % W) + W) % W;
                li[i] = qpos < 0 ? -1 : qpos >= P ? (int32_t)(chunk_off + (qpos - P)) : (int32_t)sl;
            }
        } else {
            ds41_swa_list_positions(cfg, p, lo > 0 || s->restore == 2 ? P + lo : 0, Wsw, li);
            for (int i = 0; i < Wsw; i++) {
                if (li[i] < 0) continue;
                long long qpos = li[i];
                li[i] = qpos >= P ? (int32_t)(chunk_off + (qpos - P)) : (int32_t)(qpos % W);
            }
        }
        for (int i = 0; i < kc_w; i++) {
            int32_t j = csel[(size_t)t * kc_w + i];
            li[Wsw + i] = j < 0 || !b->gmap[j] ? -1 : comp_off + b->gmap[j] - 1;
        }
    }
    clear_gather(b, n_gather);
    if (nq > 0)
        ds41_sparse_attn(ctx, cfg->n_heads, D, b->q + (size_t)q0 * HD, nq, &kv, b->list, Lw, lw->attn_sink,
                         ds41_attn_scale(cfg), b->o + (size_t)q0 * HD);
    return 0;
}

/* Ring of layer l: the SWA records of the last W positions of this forward (decode wrote its
 * slot in attend). */
static void ring_store(ds41_seq *s, fwd_buf *b, int l, int k0, int T, long long P, int layout) {
    int W = s->e->cfg->window, rb = ds41_swa_rec_bytes(s->e->cfg);
    ds41_ring *ring = &s->cache.rings[l];
    if (layout != LAYOUT_DECODE) {
        int t0 = T - W > k0 ? T - W : k0;
        for (int t = t0; t < T; t++) memcpy(ds41_ring_slot(ring, P + t), b->rec + (size_t)t * rb, (size_t)rb);
    }
}

/* The buffers of one forward over N stacked rows (one sequence: N = T), the longest
 * sequence having Tmax rows and at most Emax compressed entries per store; with_seq: also the
 * per-sequence part (index keys, top-k lists), which a batch keeps per sequence instead. */
static int buf_alloc(fwd_buf *b, const ds41_engine *e, size_t N, size_t Tmax, long long Emax) {
    const ds41_config *cfg = e->cfg;
    size_t D = (size_t)cfg->head_dim, HD = (size_t)cfg->n_heads * cfg->head_dim, W = (size_t)cfg->window;
    int fail = 0;
    memset(b, 0, sizeof *b);
    int kmax = (int)(Emax < cfg->index_topk ? Emax : cfg->index_topk);
    fail = ds41_stream_alloc(&b->s, cfg, N) != 0;
    b->kc = zalloc(N * D, sizeof(float), &fail);
    b->rec = zalloc(N * ds41_swa_rec_bytes(cfg), 1, &fail);
    b->cq = zalloc(N * cfg->q_lora_rank, sizeof(float), &fail);
    b->q = zalloc(N * HD, sizeof(float), &fail);
    b->o = zalloc(N * HD, sizeof(float), &fail);
    b->wos = zalloc(N * cfg->o_groups * cfg->o_lora_rank, sizeof(float), &fail);
    b->ringf = zalloc(W * D, sizeof(float), &fail);
    b->list = zalloc(Tmax * (W + (size_t)kmax), sizeof(int32_t), &fail);
    int n_act_max = cfg->n_active_experts > cfg->dspark_n_active ? cfg->n_active_experts : cfg->dspark_n_active;
    b->msel = zalloc(N * (size_t)(n_act_max < 1 ? 1 : n_act_max), sizeof(int), &fail);
    b->pos = zalloc(N, sizeof(int32_t), &fail);
    /* gathered main KV: each query lists at most kmax entries, and there are at most Emax */
    size_t n_gather_max = Tmax * kmax < (size_t)Emax ? Tmax * kmax : (size_t)Emax;
    b->gkv = zalloc(n_gather_max * D, sizeof(float), &fail);
    b->gent = zalloc(n_gather_max, sizeof(int32_t), &fail);
    b->grec = zalloc(n_gather_max, sizeof(uint8_t *), &fail);
    b->gmap = zalloc((size_t)Emax, sizeof(int32_t), &fail);
    if (e->has_engram) b->eg_ids = zalloc((size_t)cfg->n_engram_layers * N * eg_cols(cfg), sizeof(int64_t), &fail);
    if (fail) buf_free(b);
    return fail ? -1 : 0;
}

/* ---- the sequence's scratch: the seq_part, and the row buffers of forwards up to
 * SCRATCH_MAX_ROWS rows (decode, verify, short chunks), grown geometrically. Longer forwards
 * (prompts) take their buffers for the forward only, so a sequence never holds a prompt's. */
#define SCRATCH_MAX_ROWS 64

struct ds41_fwd_scratch {
    seq_part sp;
    fwd_buf b;
    int have;
    size_t rows;          /* capacity of b in rows */
    long long emax;       /* and in compressed entries per store */
};

static struct ds41_fwd_scratch *seq_scratch(ds41_seq *s) {
    if (s->scratch) return s->scratch;
    struct ds41_fwd_scratch *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    if (seq_part_init(&x->sp, s->e->cfg->n_layers, s->cache.n_stores)) { free(x); return NULL; }
    s->scratch = x;
    return x;
}

static void seq_scratch_free(ds41_seq *s) {
    struct ds41_fwd_scratch *x = s->scratch;
    if (!x) return;
    seq_part_free(&x->sp);
    if (x->have) buf_free(&x->b);
    free(x);
    s->scratch = NULL;
}

/* The buffers of a T-row forward of s reaching Emax entries: the scratch's (grown if needed)
 * or, past SCRATCH_MAX_ROWS, new ones in *tmp (tmp->sp too) that the caller frees with
 * fwd_release. Marks the seq_part stale. NULL when out of memory. */
static fwd_buf *fwd_acquire(ds41_seq *s, size_t T, long long Emax, fwd_buf *tmp, seq_part *tmp_sp) {
    struct ds41_fwd_scratch *x = seq_scratch(s);
    if (!x) return NULL;
    if (T > SCRATCH_MAX_ROWS) {
        if (seq_part_init(tmp_sp, s->e->cfg->n_layers, s->cache.n_stores)) return NULL;
        if (buf_alloc(tmp, s->e, T, T, Emax)) { seq_part_free(tmp_sp); return NULL; }
        tmp->sp = tmp_sp;
        seq_part_begin(tmp_sp);
        return tmp;
    }
    if (!x->have || T > x->rows || Emax > x->emax) {
        size_t rows = x->have && 2 * x->rows > T ? 2 * x->rows : T;
        if (rows > SCRATCH_MAX_ROWS) rows = SCRATCH_MAX_ROWS;
        long long emax = x->have && 2 * x->emax > Emax ? 2 * x->emax : Emax;
        if (emax < 64) emax = 64;
        if (x->have) buf_free(&x->b);
        x->have = 0;
        if (buf_alloc(&x->b, s->e, rows, rows, emax)) return NULL;
        x->have = 1;
        x->rows = rows;
        x->emax = emax;
    }
    x->b.sp = &x->sp;
    seq_part_begin(&x->sp);
    return &x->b;
}

static void fwd_release(fwd_buf *b, fwd_buf *tmp) {
    if (b != tmp) return;
    seq_part_free(tmp->sp);
    buf_free(tmp);
}

/* Engram hash ids (spec 3.2; integer only, from the token history) of the T rows of one
 * sequence at positions P.. into ids[(slot * N + r0 + t) * cols] (N stacked rows), and its new
 * history (compressed ids of the last 16 positions, most recent first) into hist_new. */
static int engram_ids(const ds41_engine *e, const ds41_cache *cache, const int32_t *tokens, int T, long long P,
                      int64_t *ids, size_t r0, size_t N, int32_t *hist_new) {
    const ds41_config *cfg = e->cfg;
    int nh = cfg->engram_max_ngram, cols = eg_cols(cfg);
    int32_t pad = e->token_map[cfg->engram_pad_id];
    int64_t *one = malloc((size_t)cfg->n_engram_layers * cols * sizeof(int64_t));
    if (!one) return -1;
    for (int t = 0; t < T; t++) {
        long long p = P + t;
        int32_t h[16];
        for (int k = 0; k < nh && k < 16; k++) {
            long long qp = p - k;
            if (qp < 0) h[k] = pad;
            else if (qp >= P) h[k] = e->token_map[tokens[qp - P]];
            else h[k] = cache->hist[P - 1 - qp];
        }
        ds41_engram_hash(&e->eg, h, p, pad, one);
        for (int sl = 0; sl < cfg->n_engram_layers; sl++)
            memcpy(ids + ((size_t)sl * N + r0 + t) * cols, one + (size_t)sl * cols, (size_t)cols * sizeof(int64_t));
    }
    free(one);
    for (int k = 0; k < 16; k++) {
        long long qp = P + T - 1 - k;
        hist_new[k] = qp < 0 ? 0 : qp >= P ? e->token_map[tokens[qp - P]] : cache->hist[P - 1 - qp];
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
    return 0;
}

/* rows != NULL (ds41_forward_rows): every layer on every row and the head on every row. */
static int forward_impl(ds41_seq *s, const int32_t *tokens, int T, int want_logits, float *rows, ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    const ds41_weights *w = e->w;
    const ds41_ctx *ctx = &e->ctx;
    ds41_cache *cache = &s->cache;
    long long P = cache->pos;
    int L = cfg->n_layers, hc = cfg->hc_mult, dim = cfg->dim;

    if (forward_check(s, tokens, T, err)) return -1;
    int layout = P == 0 ? LAYOUT_ONESHOT : T == 1 ? LAYOUT_DECODE : s->verify ? LAYOUT_VERIFY : LAYOUT_EXTEND;
    s->ik_owner0 = cache->ik_owner;   /* [verify] the published owner before this forward */

    int *qrow = malloc((size_t)L * 3 * sizeof(int));
    if (!qrow) return ds41_errf(err, "out of memory");
    int *krow = qrow + L, *lo = qrow + 2 * L;
    ds41_prefill_mode pmode = layout == LAYOUT_DECODE || rows || s->restore == 2 ? DS41_PREFILL_FULL : s->prefill;
    if (seq_row_plan(s, pmode, T, want_logits, !rows, qrow, krow, lo, err)) {
        free(qrow);
        return -1;
    }

    /* ---- buffers ---- */
    fwd_buf tmp;
    seq_part tmp_sp;
    size_t Tz = (size_t)T;
    int n_tg = cfg->n_mtp > 0 ? cfg->n_dspark_targets : 0, cols = eg_cols(cfg);
    float *mh = n_tg > 0 ? malloc(Tz * n_tg * dim * sizeof(float)) : NULL;
    fwd_buf *bp = (n_tg > 0 && !mh) ? NULL : fwd_acquire(s, Tz, max_entries(cache, P + T), &tmp, &tmp_sp);
    if (!bp) {
        free(mh);
        free(qrow);
        return ds41_errf(err, "out of memory for a forward over %d tokens", T);
    }
    fwd_buf b = *bp;   /* the buffers (b.sp the sequence's part) */
    for (int t = 0; t < T; t++) b.pos[t] = (int32_t)(P + t);

    /* ---- Engram hash ids (spec 3.2) ---- */
    int32_t hist_new[16];
    if (e->has_engram && engram_ids(e, cache, tokens, T, P, b.eg_ids, 0, Tz, hist_new)) {
        free(mh); fwd_release(bp, &tmp); free(qrow);
        return ds41_errf(err, "out of memory");
    }

    /* ---- embedding: 4 identical copies, pre = one-hot copy 0 ---- */
    for (int t = 0; t < T; t++) ds41_stream_embed(cfg, w, &b.s, (size_t)t, tokens[t]);

    int rc = 0;
    s->rows_full += (long long)L * T;
    for (int l = 0; l < L && !rc; l++) {
        if (l > 0 && s->layer_done) s->layer_done(s->layer_done_arg, s, l - 1);
        const ds41_layer_plan *lp = &cfg->layers[l];
        const ds41_layer_weights *lw = &w->layers[l];
        int k0 = krow[l], q0 = qrow[l], nk = T - k0, nq = T - q0;
        size_t srow = (size_t)hc * dim;
        s->rows_computed += nq;
        if (e->ra) {   /* --readahead: the next layer's weights (the first forward's layer 0 too) */
            if (l == 0) ds41_engine_readahead(e, 0);
            ds41_engine_readahead(e, l + 1);
        }
        /* a chunk before the rows this layer's reach starts at: nothing to compute (a KV
         * source has every row) */
        if (nk == 0) continue;

        /* Engram before the block, on the rows of the stream that exist */
        if (lp->engram_slot >= 0 && e->has_engram)
            ds41_engram_apply(ctx, cfg, lw, b.eg_ids + ((size_t)lp->engram_slot * T + k0) * cols, nk, NULL,
                              b.s.X + k0 * srow);
        /* DSpark tap: mean over the copies of the block's input stream */
        int ti = lp->is_dspark_target && mh ? dspark_target_index(cfg, n_tg, l) : -1;
        if (ti >= 0) dspark_tap(ctx, cfg, b.s.X, (size_t)k0, Tz, ti, n_tg, mh);

        /* ---- attention sublayer ---- */
        ds41_block_attn_in(ctx, cfg, lw, &b.s, (size_t)q0, nq, (size_t)k0, nk);
        double ta = ctx->prof ? ds41_prof_now() : 0.0;
        if (attention(s, &b, l, k0, q0, lo[l], T, P, layout, err)) { rc = -1; break; }
        if (ctx->prof) ctx->prof[DS41_PROF_ATTN] += ds41_prof_now() - ta;
        if (nq == 0) continue;
        ds41_block_attn_out(ctx, cfg, &b.s, (size_t)q0, nq);

        /* ---- MoE sublayer ---- */
        for (size_t i = 0; i < Tz * lp->n_active; i++) b.msel[i] = -1;
        ds41_block_ffn(ctx, cfg, lw, lp, &b.s, (size_t)q0, nq, b.msel + (size_t)q0 * lp->n_active);

        /* ---- trace ---- */
        if (s->trace) trace_layer(s->trace, lp, l, &b, T);
    }

    if (!rc && s->layer_done) s->layer_done(s->layer_done_arg, s, L - 1);
    /* ---- collapse, final norm, head (last row only; every row for ds41_forward_rows) ---- */
    if (!rc && rows && s->verify) {
        /* [verify] the head row by row: the GEMV path decode uses (the multi-row BF16 head is
         * much slower at small T; row-independent, so exact mode is unaffected) */
        for (int t = 0; t < T; t++) ds41_stream_head(ctx, cfg, w, w->norm, &b.s, (size_t)t, 1, rows + (size_t)t * cfg->vocab_size);
        memcpy(s->logits, rows + (Tz - 1) * cfg->vocab_size, (size_t)cfg->vocab_size * sizeof(float));
    } else if (!rc && rows) {
        ds41_stream_head(ctx, cfg, w, w->norm, &b.s, 0, T, rows);
        memcpy(s->logits, rows + (Tz - 1) * cfg->vocab_size, (size_t)cfg->vocab_size * sizeof(float));
    } else if (!rc && want_logits) {
        ds41_stream_head(ctx, cfg, w, w->norm, &b.s, Tz - 1, 1, s->logits);
    }
    if (!rc) {
        /* keep the DSpark rows computed for every target (CED: the last window at least) */
        int r0 = 0;
        for (int i = 0; i < n_tg; i++) {
            int l = cfg->dspark_targets[i];
            if (l >= 0 && l < L && krow[l] > r0) r0 = krow[l];
        }
        forward_commit(s, T, hist_new, mh, r0);
        mh = NULL;
    }
    free(mh);
    fwd_release(bp, &tmp);
    free(qrow);
    return rc;
}

int ds41_forward(ds41_seq *s, const int32_t *tokens, int T, int want_logits, ds41_err *err) {
    return forward_impl(s, tokens, T, want_logits, NULL, err);
}

/* ====================================================================== all-row logits */

int ds41_forward_rows(ds41_seq *s, const int32_t *tokens, int T, float *rows, ds41_err *err) {
    if (!rows) return ds41_errf(err, "forward: no output buffer for the logits rows");
    return forward_impl(s, tokens, T, 1, rows, err);
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

/* ====================================================================== batch */

/* The part of a batch that one sequence sees: its rows [r0, r0 + T) of the stacked buffers,
 * its own index keys, top-k lists and candidate pool, and the shared per-sequence scratch
 * (ring, lists, gathered KV), which the sequences use one after another. */
static void batch_view(fwd_buf *v, const fwd_buf *b, const ds41_config *cfg, size_t r0) {
    size_t D = (size_t)cfg->head_dim, HD = (size_t)cfg->n_heads * cfg->head_dim;
    v->kc = b->kc + r0 * D;
    v->rec = b->rec + r0 * ds41_swa_rec_bytes(cfg);
    v->cq = b->cq + r0 * cfg->q_lora_rank;
    v->q = b->q + r0 * HD;
    v->o = b->o + r0 * HD;
    v->pos = b->pos + r0;
    v->ringf = b->ringf;
    v->list = b->list;
    v->gkv = b->gkv;
    v->gmap = b->gmap;
    v->gent = b->gent;
    v->grec = b->grec;
}

typedef struct batch_seqs {
    ds41_seq *const *ss;
    fwd_buf *v;               /* per sequence: its view */
    const int *T;             /* rows per sequence */
    const size_t *r0;         /* first stacked row */
    const int *layout;
    int count;
    size_t N;                 /* stacked rows */
    float *cproj, *iq, *wt;   /* compressor projections [2N, head_dim], indexer queries and weights [N, ...] */
    int chunk;                /* sequence 0 feeds a prefill chunk (its row plan applies) */
} batch_seqs;

/* P6 in a batch: the indexer query over the stacked rows from Q0, then each sequence's
 * indexer_select (iq / wt rows are the stack's rows from Q0 on). */
typedef struct bix_job {
    ds41_ctx ctx;
    const batch_seqs *bs;
    fwd_buf *b;
    int l, q0, rc;
    ds41_err err;
} bix_job;

static void bix_run(void *arg) {
    bix_job *j = arg;
    const batch_seqs *bs = j->bs;
    ds41_engine *e = bs->ss[0]->e;
    const ds41_config *cfg = e->cfg;
    size_t N = bs->N, Q0 = (size_t)j->q0, NH = (size_t)cfg->index_n_heads, ID = (size_t)cfg->index_head_dim;
    ds41_indexer_query(&j->ctx, cfg, &e->w->layers[j->l], &e->ropes[e->layer_rope[j->l]],
                       j->b->cq + Q0 * cfg->q_lora_rank, j->b->s.xa + Q0 * cfg->dim, (int)(N - Q0), j->b->pos + Q0, bs->iq,
                       bs->wt);
    for (int i = 0; i < bs->count && !j->rc; i++) {
        int qi = i == 0 && bs->chunk ? j->q0 : 0;
        if (qi >= bs->T[i]) continue;   /* a prompt part without query rows here: no indexer (as alone) */
        size_t off = bs->r0[i] + (size_t)qi - Q0;
        if (indexer_select(&j->ctx, bs->ss[i], &bs->v[i], j->l, qi, bs->T[i], bs->ss[i]->cache.pos, bs->iq + off * NH * ID,
                           bs->wt + off * NH, &j->err))
            j->rc = -1;
    }
}

/* The attention sublayer of layer l over a batch: the projections (SWA K, compressor, query,
 * indexer query, output) over the stacked rows, the rest per sequence with exactly the calls a
 * forward of that sequence alone makes (compressor_emit, indexer_select, attend, ring_store on
 * its view). A prefill chunk (sequence 0 when bs->chunk) takes its row plan: keys of its rows
 * [k0, T0), queries of [q0, T0), lists from lo; it is stacked first, so the layer's key rows
 * are [k0, N) and its query rows [q0, N) of the stack, both contiguous. */
static int attention_batch(const batch_seqs *bs, fwd_buf *b, int l, int k0, int q0, int lo, ds41_err *err) {
    ds41_engine *e = bs->ss[0]->e;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_plan *lp = &cfg->layers[l];
    const ds41_layer_weights *lw = &e->w->layers[l];
    const ds41_rope *rope = &e->ropes[e->layer_rope[l]];
    const ds41_ctx *ctx = &e->ctx;
    size_t N = bs->N, D = (size_t)cfg->head_dim;
    size_t dim = (size_t)cfg->dim, HD = (size_t)cfg->n_heads * cfg->head_dim, rb = (size_t)ds41_swa_rec_bytes(cfg);
    size_t K0 = (size_t)k0, Q0 = (size_t)q0;

    ds41_attn_swa_k(ctx, cfg, lw, rope, b->s.xa + K0 * dim, (int)(N - K0), b->pos + K0, b->kc + K0 * D, b->rec + K0 * rb);
    if (lp->is_kv_source) {
        /* a KV source computes every row (ds41_row_plan), so K0 = 0 here */
        if (K0) return ds41_errf(err, "batch: layer %d is a KV source but its key rows start at %zu", l, K0);
        int r = ds41_cache_store(&bs->ss[0]->cache, l)->ratio;
        float *kv = bs->cproj, *sc = bs->cproj + N * D;
        if (r == 1) ds41_compress_r1(ctx, cfg, lw, b->s.xa, (int)N, kv);
        else ds41_compress_proj(ctx, cfg, lw, b->s.xa, (int)N, kv, sc);
        for (int i = 0; i < bs->count; i++) {
            ds41_seq *s = bs->ss[i];
            int em = compressor_emit(s, l, kv + bs->r0[i] * D, r == 1 ? NULL : sc + bs->r0[i] * D, bs->T[i], s->cache.pos,
                                     bs->layout[i], err);
            if (em < 0) return -1;
            if (em > 0) s->cache.ik_owner = l;
        }
    }
    /* the query path (no query rows: a prompt part alone whose plan keeps only keys here), the
     * indexers beside wq_b (P6, as query_and_indexer) */
    if (N > Q0) {
        ds41_attn_query_c(ctx, cfg, lw, b->s.xa + Q0 * dim, (int)(N - Q0), b->cq + Q0 * cfg->q_lora_rank);
        bix_job bj = { side_ctx(ctx), bs, b, l, q0, 0, { { 0 } } };
        int ix = lp->is_index_source;
        int side = ix && !(ctx->ablate & DS41_ABLATE_P6) && ds41_side_start(e->side, bix_run, &bj) == 0;
        if (ix && !side) {
            bj.ctx = *ctx;
            bix_run(&bj);
        }
        ds41_attn_query_q(ctx, cfg, lw, rope, b->cq + Q0 * cfg->q_lora_rank, (int)(N - Q0), b->pos + Q0, b->q + Q0 * HD);
        if (side) ds41_side_wait(e->side);
        if (bj.rc) { *err = bj.err; return -1; }
    }
    /* a prompt part with no rows in this layer takes no part in it (ds41_forward skips it) */
    int skip0 = bs->chunk && k0 >= bs->T[0];
    for (int i = skip0; i < bs->count; i++) {
        int c = i == 0 && bs->chunk;
        if (attend(bs->ss[i], &bs->v[i], l, c ? q0 : 0, c ? lo : 0, bs->T[i], bs->ss[i]->cache.pos, bs->layout[i], err))
            return -1;
    }
    if (N > Q0) ds41_attn_output(ctx, cfg, lw, rope, b->o + Q0 * HD, (int)(N - Q0), b->pos + Q0, b->wos, b->s.y + Q0 * dim);
    for (int i = skip0; i < bs->count; i++)
        ring_store(bs->ss[i], &bs->v[i], l, i == 0 && bs->chunk ? k0 : 0, bs->T[i], bs->ss[i]->cache.pos, bs->layout[i]);
    return 0;
}

int ds41_forward_batch(ds41_seq *const *ss, const int32_t *const *tokens, const int *T, float *const *rows, int count,
                       ds41_err *err) {
    if (count < 1) return 0;
    ds41_engine *e = ss[0]->e;
    const ds41_config *cfg = e->cfg;
    const ds41_weights *w = e->w;
    const ds41_ctx *ctx = &e->ctx;
    int L = cfg->n_layers, dim = cfg->dim, V = cfg->vocab_size;
    size_t N = 0, Tmax = 0;
    long long Emax = 0;
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
        for (int j = 0; j < i; j++)
            if (ss[j] == s) return ds41_errf(err, "batch: sequence %d appears twice", i);
        N += (size_t)T[i];
        if ((size_t)T[i] > Tmax) Tmax = (size_t)T[i];
        long long E = max_entries(&s->cache, s->cache.pos + T[i]);
        if (E > Emax) Emax = E;
    }

    /* ---- the prefill chunk's row plan (CED as ds41_forward with logits; others: every row) ---- */
    int chunk = T[0] > 1 && !ss[0]->verify;
    int *qrow = calloc((size_t)L * 3, sizeof(int));
    if (!qrow) return ds41_errf(err, "out of memory");
    int *krow = qrow + L, *lo = qrow + 2 * L;
    /* a part of a prompt that goes on (plan_ahead > 0) wants no logits: its plan reaches from
     * the prompt's end, and its rows may stop short of the last layers */
    int chunk_logits = chunk && ss[0]->plan_ahead == 0;
    if (chunk && seq_row_plan(ss[0], ss[0]->prefill, T[0], 1, 1, qrow, krow, lo, err)) {
        free(qrow);
        return -1;
    }
    /* the head runs on the chunk's last row (when it wants logits) and every row after it */
    size_t h0 = chunk ? (size_t)T[0] - (chunk_logits ? 1 : 0) : 0;

    /* ---- buffers: the stacked rows, and per sequence its view ---- */
    int n_tg = cfg->n_mtp > 0 ? cfg->n_dspark_targets : 0, cols = eg_cols(cfg);
    size_t D = (size_t)cfg->head_dim;
    fwd_buf b;
    fwd_buf *v = calloc((size_t)count, sizeof *v);
    size_t *r0 = calloc((size_t)count, sizeof *r0);
    int *layout = calloc((size_t)count, sizeof *layout);
    int32_t (*hist)[16] = calloc((size_t)count, sizeof *hist);
    float *mh = n_tg > 0 ? calloc(N * n_tg * dim, sizeof(float)) : NULL;
    float *cproj = malloc(2 * N * D * sizeof(float));
    float *iq = malloc((N * cfg->index_n_heads * cfg->index_head_dim + 1) * sizeof(float));
    float *wt = malloc((N * cfg->index_n_heads + 1) * sizeof(float));
    float *lg = malloc(((N - h0) + 1) * V * sizeof(float));
    int fail = !v || !r0 || !layout || !hist || (n_tg > 0 && !mh) || !cproj || !iq || !wt || !lg;
    int have_b = !fail && buf_alloc(&b, e, N, Tmax, Emax) == 0;
    fail |= !have_b;
    for (int i = 0, r = 0; i < count && !fail; r += T[i], i++) {
        r0[i] = (size_t)r;
        layout[i] = i == 0 && chunk ? (ss[0]->cache.pos == 0 ? LAYOUT_ONESHOT : LAYOUT_EXTEND)
                    : T[i] == 1     ? LAYOUT_DECODE
                                    : LAYOUT_VERIFY;
        batch_view(&v[i], &b, cfg, r0[i]);
        struct ds41_fwd_scratch *x = seq_scratch(ss[i]);   /* its own part: index keys, top-k lists, pool */
        if (!x) { fail = 1; break; }
        v[i].sp = &x->sp;
        seq_part_begin(&x->sp);
    }
    batch_seqs bs = { ss, v, T, r0, layout, count, N, cproj, iq, wt, chunk };
    int rc = 0;
    if (fail) { rc = ds41_errf(err, "out of memory for a batch of %d sequences (%zu rows)", count, N); goto done; }

    /* ---- per sequence: positions, Engram ids, embedding ---- */
    for (int i = 0; i < count; i++) {
        ds41_seq *s = ss[i];
        s->ik_owner0 = s->cache.ik_owner;
        for (int t = 0; t < T[i]; t++) {
            b.pos[r0[i] + t] = (int32_t)(s->cache.pos + t);
            ds41_stream_embed(cfg, w, &b.s, r0[i] + t, tokens[i][t]);
        }
        if (e->has_engram && engram_ids(e, &s->cache, tokens[i], T[i], s->cache.pos, b.eg_ids, r0[i], N, hist[i])) {
            rc = ds41_errf(err, "out of memory");
            goto done;
        }
        s->rows_full += (long long)L * T[i];
        for (int l = 0; l < L; l++) s->rows_computed += T[i] - (i == 0 ? qrow[l] : 0);
    }

    /* ---- the block loop over the stacked rows: layer l on the rows [k0, N) / [q0, N) that the
     * chunk's plan keeps (0 without a chunk: every layer on every row) ---- */
    size_t srow = (size_t)cfg->hc_mult * dim;
    for (int l = 0; l < L; l++) {
        const ds41_layer_plan *lp = &cfg->layers[l];
        const ds41_layer_weights *lw = &w->layers[l];
        size_t k0 = (size_t)krow[l], q0 = (size_t)qrow[l];
        /* a prompt part whose plan has no rows in this layer, alone in the batch: nothing to
         * compute (ds41_forward skips such a layer too) */
        if (k0 == N) continue;
        if (lp->engram_slot >= 0 && e->has_engram)
            ds41_engram_apply(ctx, cfg, lw, b.eg_ids + ((size_t)lp->engram_slot * N + k0) * cols, (int)(N - k0), NULL,
                              b.s.X + k0 * srow);
        int ti = lp->is_dspark_target && mh ? dspark_target_index(cfg, n_tg, l) : -1;
        if (ti >= 0) dspark_tap(ctx, cfg, b.s.X, k0, N, ti, n_tg, mh);

        ds41_block_attn_in(ctx, cfg, lw, &b.s, q0, (int)(N - q0), k0, (int)(N - k0));
        if (attention_batch(&bs, &b, l, (int)k0, (int)q0, lo[l], err)) { rc = -1; goto done; }
        if (q0 == N) continue;   /* keys only (a prompt part alone) */
        ds41_block_attn_out(ctx, cfg, &b.s, q0, (int)(N - q0));

        for (size_t i = q0 * lp->n_active; i < N * lp->n_active; i++) b.msel[i] = -1;
        ds41_block_ffn(ctx, cfg, lw, lp, &b.s, q0, (int)(N - q0), b.msel + q0 * lp->n_active);
    }

    /* ---- head on the rows from h0 (every row but a chunk's first T0 - 1); each sequence takes
     * its rows ---- */
    if (N > h0) ds41_stream_head(ctx, cfg, w, w->norm, &b.s, h0, (int)(N - h0), lg);
    for (int i = 0; i < count; i++) {
        ds41_seq *s = ss[i];
        /* lg holds the stack's rows from h0 on (a chunk's rows before its last are not there;
         * all-row logits of a chunk were refused above; a part of a prompt that goes on has no
         * logits, as ds41_forward without want_logits leaves them) */
        if (rows && rows[i]) memcpy(rows[i], lg + (r0[i] - h0) * V, (size_t)T[i] * V * sizeof(float));
        if (!(i == 0 && chunk && !chunk_logits))
            memcpy(s->logits, lg + (r0[i] + (size_t)T[i] - 1 - h0) * V, (size_t)V * sizeof(float));
        float *m = NULL;
        if (mh) {
            m = malloc((size_t)T[i] * n_tg * dim * sizeof(float));
            if (!m) { rc = ds41_errf(err, "out of memory"); goto done; }
            memcpy(m, mh + r0[i] * n_tg * dim, (size_t)T[i] * n_tg * dim * sizeof(float));
        }
        /* a chunk keeps the DSpark rows its plan computed for every target, as ds41_forward */
        int keep0 = 0;
        for (int k = 0; i == 0 && chunk && k < n_tg; k++) {
            int l = cfg->dspark_targets[k];
            if (l >= 0 && l < L && krow[l] > keep0) keep0 = krow[l];
        }
        forward_commit(s, T[i], hist[i], m, keep0);
    }

done:
    if (have_b) buf_free(&b);
    free(v); free(r0); free(layout); free(hist); free(mh); free(cproj); free(iq); free(wt); free(lg); free(qrow);
    return rc;
}
