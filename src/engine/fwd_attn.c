/* ds41 forward pass, the attention side (spec 3.5-3.13): the buffers and per-sequence scratch
 * of a forward, the compressor, the indexer, the KV set with its lists and the sparse
 * attention of one sequence, and the attention sublayer over the stacked sequences of a
 * forward (forward.c runs the layer loop; one sequence is a stack of one).
 *
 * KV list of one layer (spec 3.11, docs/conformance.md), as a ds41_kvset:
 *   one-shot (P = 0):   [chunk keys (row = position) ; compressed entries]
 *   extend (P > 0, T>1): [ring before the chunk (slot order) ; chunk keys ; compressed]
 *   decode (T = 1):     [ring after writing slot P mod window ; compressed]
 * "compressed" holds only the main-KV entries some query of the layer lists (gather_kv),
 * dequantized from the store's records; the lists are renumbered to match.
 *
 * Scratch: ds41_seq.scratch owns the sequence's indexer buffers (seq_part) and the row buffers
 * of short forwards, grown when needed; a decode step allocates little. */
#include "fwd_attn.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "formats.h"

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
void ds41_fwd_part_begin(seq_part *p) {
    memset(p->sel_w, 0, ((size_t)p->n_layers + 1) * sizeof(int));
    p->pool_nb = 0;
}

/* *buf holds at least n elements of size sz (grown to max(n, 2 x its size); contents lost). */
int ds41_fwd_grow(void **buf, size_t *cap, size_t n, size_t sz) {
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

void ds41_fwd_buf_free(fwd_buf *b) {
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
void ds41_fwd_trace_layer(ds41_trace *tr, const ds41_layer_plan *lp, int l, const seq_part *sp, const int *msel, int T) {
    if (lp->is_index_source && tr->topk && tr->topk[l]) {
        int32_t hdr[2] = { T, sp->sel_w[l] };
        trace_i32(tr->topk[l], hdr, 2);
        if (sp->sel[l]) trace_i32(tr->topk[l], sp->sel[l], (size_t)T * sp->sel_w[l]);
    }
    if (tr->experts && tr->experts[l]) {
        int32_t hdr[2] = { T, lp->n_active };
        trace_i32(tr->experts[l], hdr, 2);
        trace_i32(tr->experts[l], msel, (size_t)T * lp->n_active);
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
    if (ds41_fwd_grow((void **)&sp->sel[l], &sp->sel_cap[l], (size_t)T * (k ? k : 1), sizeof(int32_t)))
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
    if (ds41_fwd_grow((void **)&sp->scores, &sp->scores_cap, (size_t)E, sizeof(float)) ||
        ds41_fwd_grow((void **)&sp->iscr, &sp->iscr_cap, (size_t)E * 2 + 8, sizeof(int)) ||
        ds41_fwd_grow((void **)&sp->chosen, &sp->chosen_cap, (size_t)k, sizeof(int)))
        return ds41_errf(err, "out of memory in the indexer of layer %d", l);
    float *scores = sp->scores;
    int *scratch = sp->iscr, *chosen = sp->chosen;
    int B = cfg->candidate_block_size > 0 ? cfg->candidate_block_size : 1;
    int nb = (int)((E + B - 1) / B);
    if (lp->is_candidate_source) {
        if (ds41_fwd_grow((void **)&sp->pool, &sp->pool_cap, (size_t)T * nb, 1)) return ds41_errf(err, "out of memory");
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

/* The parts of a forward's buffers that depend on the entries (Emax) as well as the rows:
 * the SWA + top-k lists and the gathered main KV. gmap is zero (calloc) and stays so between
 * forwards (clear_gather). */
static void fwd_buf_entries_free(fwd_buf *b) {
    free(b->list); free(b->gkv); free(b->gmap); free(b->gent); free(b->grec);
    b->list = NULL; b->gkv = NULL; b->gmap = NULL; b->gent = NULL; b->grec = NULL;
}

static int fwd_buf_entries_alloc(fwd_buf *b, const ds41_engine *e, size_t Tmax, long long Emax) {
    const ds41_config *cfg = e->cfg;
    size_t D = (size_t)cfg->head_dim, W = (size_t)cfg->window;
    int fail = 0;
    int kmax = (int)(Emax < cfg->index_topk ? Emax : cfg->index_topk);
    b->list = zalloc(Tmax * (W + (size_t)kmax), sizeof(int32_t), &fail);
    /* gathered main KV: each query lists at most kmax entries, and there are at most Emax */
    size_t n_gather_max = Tmax * kmax < (size_t)Emax ? Tmax * kmax : (size_t)Emax;
    b->gkv = zalloc(n_gather_max * D, sizeof(float), &fail);
    b->gent = zalloc(n_gather_max, sizeof(int32_t), &fail);
    b->grec = zalloc(n_gather_max, sizeof(uint8_t *), &fail);
    b->gmap = zalloc((size_t)Emax, sizeof(int32_t), &fail);
    return fail ? -1 : 0;
}

/* The parts that depend on the rows only. */
static int fwd_buf_rows_alloc(fwd_buf *b, const ds41_engine *e, size_t N) {
    const ds41_config *cfg = e->cfg;
    size_t D = (size_t)cfg->head_dim, HD = (size_t)cfg->n_heads * cfg->head_dim, W = (size_t)cfg->window;
    int fail = ds41_stream_alloc(&b->s, cfg, N) != 0;
    b->kc = zalloc(N * D, sizeof(float), &fail);
    b->rec = zalloc(N * ds41_swa_rec_bytes(cfg), 1, &fail);
    b->cq = zalloc(N * cfg->q_lora_rank, sizeof(float), &fail);
    b->q = zalloc(N * HD, sizeof(float), &fail);
    b->o = zalloc(N * HD, sizeof(float), &fail);
    b->wos = zalloc(N * cfg->o_groups * cfg->o_lora_rank, sizeof(float), &fail);
    b->ringf = zalloc(W * D, sizeof(float), &fail);
    int n_act_max = cfg->n_active_experts > cfg->dspark_n_active ? cfg->n_active_experts : cfg->dspark_n_active;
    b->msel = zalloc(N * (size_t)(n_act_max < 1 ? 1 : n_act_max), sizeof(int), &fail);
    b->pos = zalloc(N, sizeof(int32_t), &fail);
    if (e->has_engram) b->eg_ids = zalloc((size_t)cfg->n_engram_layers * N * ds41_fwd_eg_cols(cfg), sizeof(int64_t), &fail);
    return fail ? -1 : 0;
}

static void fwd_buf_rows_free(fwd_buf *b) {
    ds41_stream_free(&b->s);
    free(b->kc); free(b->rec); free(b->cq); free(b->q); free(b->o); free(b->wos); free(b->ringf);
    free(b->msel); free(b->pos); free(b->eg_ids);
    b->kc = NULL; b->rec = NULL; b->cq = NULL; b->q = NULL; b->o = NULL; b->wos = NULL; b->ringf = NULL;
    b->msel = NULL; b->pos = NULL; b->eg_ids = NULL;
}

/* The buffers of one forward over N stacked rows (one sequence: N = T), the longest
 * sequence having Tmax rows and at most Emax compressed entries per store. */
int ds41_fwd_buf_alloc(fwd_buf *b, const ds41_engine *e, size_t N, size_t Tmax, long long Emax) {
    memset(b, 0, sizeof *b);
    if (fwd_buf_rows_alloc(b, e, N) || fwd_buf_entries_alloc(b, e, Tmax, Emax)) {
        ds41_fwd_buf_free(b);
        return -1;
    }
    return 0;
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

struct ds41_fwd_scratch *ds41_fwd_scratch_get(ds41_seq *s) {
    if (s->scratch) return s->scratch;
    struct ds41_fwd_scratch *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    if (seq_part_init(&x->sp, s->e->cfg->n_layers, s->cache.n_stores)) { free(x); return NULL; }
    s->scratch = x;
    return x;
}

void ds41_fwd_scratch_free(ds41_seq *s) {
    struct ds41_fwd_scratch *x = s->scratch;
    if (!x) return;
    seq_part_free(&x->sp);
    if (x->have) ds41_fwd_buf_free(&x->b);
    free(x);
    s->scratch = NULL;
}

/* The buffers of a T-row forward of s reaching Emax entries: the scratch's (grown if needed)
 * or, past SCRATCH_MAX_ROWS, new ones in *tmp (tmp->sp too) that the caller frees with
 * fwd_release. Marks the seq_part stale. NULL when out of memory. */
fwd_buf *ds41_fwd_acquire(ds41_seq *s, size_t T, long long Emax, fwd_buf *tmp, seq_part *tmp_sp) {
    struct ds41_fwd_scratch *x = ds41_fwd_scratch_get(s);
    if (!x) return NULL;
    if (T > SCRATCH_MAX_ROWS) {
        if (seq_part_init(tmp_sp, s->e->cfg->n_layers, s->cache.n_stores)) return NULL;
        if (ds41_fwd_buf_alloc(tmp, s->e, T, T, Emax)) { seq_part_free(tmp_sp); return NULL; }
        tmp->sp = tmp_sp;
        ds41_fwd_part_begin(tmp_sp);
        return tmp;
    }
    if (!x->have || T > x->rows || Emax > x->emax) {
        /* grown geometrically, the row buffers and the entry buffers each only when they must:
         * a sequence that grows past 64, 128, 256 ... entries keeps its row buffers (they were
         * all reallocated, and reallocated memory is fresh: the pages a forward touches fault
         * in again). The rows grow at the first verify block, not before: a --spec auto
         * session whose gate stays shut never verifies. */
        size_t rows = x->have ? x->rows : 0;
        long long emax = x->have ? x->emax : 0;
        int grow_rows = T > rows;
        if (grow_rows) {
            rows = 2 * rows > T ? 2 * rows : T;
            if (rows > SCRATCH_MAX_ROWS) rows = SCRATCH_MAX_ROWS;
        }
        if (Emax > emax) {
            emax = 2 * emax > Emax ? 2 * emax : Emax;
            if (emax < 64) emax = 64;
        }
        if (!x->have) memset(&x->b, 0, sizeof x->b);
        x->have = 1;
        if (grow_rows) {
            fwd_buf_rows_free(&x->b);
            if (fwd_buf_rows_alloc(&x->b, s->e, rows)) { ds41_fwd_buf_free(&x->b); x->have = 0; return NULL; }
        }
        if (grow_rows || emax != x->emax) {
            fwd_buf_entries_free(&x->b);
            if (fwd_buf_entries_alloc(&x->b, s->e, rows, emax)) { ds41_fwd_buf_free(&x->b); x->have = 0; return NULL; }
        }
        x->rows = rows;
        x->emax = emax;
    }
    x->b.sp = &x->sp;
    ds41_fwd_part_begin(&x->sp);
    return &x->b;
}

void ds41_fwd_release(fwd_buf *b, fwd_buf *tmp) {
    if (b != tmp) return;
    seq_part_free(tmp->sp);
    ds41_fwd_buf_free(tmp);
}

/* ====================================================================== stacked sequences */

void ds41_fwd_view(fwd_buf *v, const fwd_buf *b, const ds41_config *cfg, size_t r0) {
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

seq_part *ds41_fwd_scratch_part(struct ds41_fwd_scratch *x) {
    return &x->sp;
}

/* The context a side task runs with: the engine's kernels, one thread, no timers. */
static ds41_ctx side_ctx(const ds41_ctx *c) {
    ds41_ctx x = *c;
    x.pool = NULL;
    x.n_threads = 1;
    x.prof = NULL;
    x.bd = NULL;
    return x;
}

/* P6: the indexer of a layer overlapped with the query projection. After cq (wq_a + norm), the
 * indexer (its query projection over the stacked rows from Q0, then each sequence's scores,
 * candidate pool and top-k) needs only cq and the layer input, and q (wq_b, the layer's
 * largest projection at production width, + RoPE) only cq: the indexer runs on the engine's
 * side worker, single-threaded, while the caller computes q with its pool; then the caller
 * waits. Every result is what the serial order computes (the kernels' results do not depend on
 * the thread count). */
typedef struct ix_job {
    ds41_ctx ctx;             /* the engine's without the pool (side), or the engine's */
    const fwd_seqs *fs;
    fwd_buf *b;
    int l, q0, rc;
    double seconds;
    ds41_err err;
} ix_job;

static void ix_run(void *arg) {
    ix_job *j = arg;
    double t0 = ds41_prof_now();
    if (j->ctx.bd) ds41_bd_enter(&j->ctx, DS41_BD_INDEXER, 0);
    const fwd_seqs *fs = j->fs;
    ds41_engine *e = fs->ss[0]->e;
    const ds41_config *cfg = e->cfg;
    size_t N = fs->N, Q0 = (size_t)j->q0, NH = (size_t)cfg->index_n_heads, ID = (size_t)cfg->index_head_dim;
    ds41_indexer_query(&j->ctx, cfg, &e->w->layers[j->l], &e->ropes[e->layer_rope[j->l]],
                       j->b->cq + Q0 * cfg->q_lora_rank, j->b->s.xa + Q0 * cfg->dim, (int)(N - Q0), j->b->pos + Q0, fs->iq,
                       fs->wt);
    for (int i = 0; i < fs->count && !j->rc; i++) {
        int qi = i == 0 ? j->q0 : 0;
        if (qi >= fs->T[i]) continue;   /* a prompt part without query rows here: no indexer */
        size_t off = fs->r0[i] + (size_t)qi - Q0;
        if (indexer_select(&j->ctx, fs->ss[i], &fs->v[i], j->l, qi, fs->T[i], fs->ss[i]->cache.pos, fs->iq + off * NH * ID,
                           fs->wt + off * NH, &j->err))
            j->rc = -1;
    }
    if (j->ctx.bd) ds41_bd_leave(&j->ctx);
    j->seconds = ds41_prof_now() - t0;
}

/* The compressor of KV-source layer l (every row is computed for a KV source, so the key rows
 * start at 0). One sequence: its own projection (the fused ratio-1 path, P1) or, in a
 * prefix-cache replay, the restored entries; several: one projection over the stacked rows,
 * then each sequence's pooling and records. */
static int compressor(const fwd_seqs *fs, fwd_buf *b, int l, ds41_err *err) {
    ds41_engine *e = fs->ss[0]->e;
    const ds41_config *cfg = e->cfg;
    const ds41_ctx *ctx = &e->ctx;
    size_t N = fs->N, D = (size_t)cfg->head_dim;
    if (fs->count == 1) {
        ds41_seq *s = fs->ss[0];
        long long P = s->cache.pos;
        int em = s->restore ? restored_entries(s, l, fs->T[0], P, err)
                            : run_compressor(s, l, b->s.xa, fs->T[0], P, fs->layout[0], err);
        if (em < 0) return -1;
        if (em > 0) s->cache.ik_owner = l;
        return 0;
    }
    int r = ds41_cache_store(&fs->ss[0]->cache, l)->ratio;
    float *kv = fs->cproj, *sc = fs->cproj + N * D;
    if (r == 1) ds41_compress_r1(ctx, cfg, &e->w->layers[l], b->s.xa, (int)N, kv);
    else ds41_compress_proj(ctx, cfg, &e->w->layers[l], b->s.xa, (int)N, kv, sc);
    for (int i = 0; i < fs->count; i++) {
        ds41_seq *s = fs->ss[i];
        int em = s->restore ? restored_entries(s, l, fs->T[i], s->cache.pos, err)
                            : compressor_emit(s, l, kv + fs->r0[i] * D, r == 1 ? NULL : sc + fs->r0[i] * D, fs->T[i],
                                              s->cache.pos, fs->layout[i], err);
        if (em < 0) return -1;
        if (em > 0) s->cache.ik_owner = l;
    }
    return 0;
}

/* Every linear runs once over the stacked rows (SWA K, compressor, query, indexer query,
 * output); what reads or writes a sequence's state (compressor_emit, indexer_select, attend,
 * ring_store) runs per sequence on its view. Sequence 0's row plan: keys of its rows [k0, T0),
 * queries of [q0, T0), lists from lo; it is stacked first, so the layer's key rows are [k0, N)
 * and its query rows [q0, N) of the stack, both contiguous. */
int ds41_fwd_attention(const fwd_seqs *fs, fwd_buf *b, int l, int k0, int q0, int lo, ds41_err *err) {
    ds41_engine *e = fs->ss[0]->e;
    const ds41_config *cfg = e->cfg;
    const ds41_layer_plan *lp = &cfg->layers[l];
    const ds41_layer_weights *lw = &e->w->layers[l];
    const ds41_rope *rope = &e->ropes[e->layer_rope[l]];
    const ds41_ctx *ctx = &e->ctx;
    size_t N = fs->N, D = (size_t)cfg->head_dim;
    size_t dim = (size_t)cfg->dim, HD = (size_t)cfg->n_heads * cfg->head_dim, rb = (size_t)ds41_swa_rec_bytes(cfg);
    size_t K0 = (size_t)k0, Q0 = (size_t)q0;

    ds41_attn_swa_k(ctx, cfg, lw, rope, b->s.xa + K0 * dim, (int)(N - K0), b->pos + K0, b->kc + K0 * D, b->rec + K0 * rb);
    if (lp->is_kv_source) {
        /* the compressor reads every row (a prefix-cache replay restores its entries instead) */
        if (K0 && !(fs->count == 1 && fs->ss[0]->restore))
            return ds41_errf(err, "forward: layer %d is a KV source but its key rows start at %zu", l, K0);
        double t0 = ctx->prof ? ds41_prof_now() : 0.0;
        if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_COMPRESS, 0);
        int crc = compressor(fs, b, l, err);
        /* the CSA2-less twin (twin.c): the decoder layers' own compressors read this input too */
        for (int m = l + 1; m < cfg->n_layers && !crc; m++)
            if (cfg->layers[m].twin_kv_at == l) crc = compressor(fs, b, m, err);
        if (ctx->bd) ds41_bd_leave(ctx);
        if (crc) return -1;
        if (ctx->prof) ctx->prof[DS41_PROF_COMPRESS] += ds41_prof_now() - t0;
    }
    /* the query path (no query rows: a prompt part whose plan keeps only keys here), the
     * indexers beside wq_b (P6) */
    if (N > Q0) {
        ds41_attn_query_c(ctx, cfg, lw, b->s.xa + Q0 * dim, (int)(N - Q0), b->cq + Q0 * cfg->q_lora_rank);
        ix_job j = { side_ctx(ctx), fs, b, l, q0, 0, 0.0, { { 0 } } };
        int ix = lp->is_index_source;
        int side = ix && !(ctx->ablate & DS41_ABLATE_P6) && ds41_side_start(e->side, ix_run, &j) == 0;
        if (ix && !side) {
            j.ctx = *ctx;
            ix_run(&j);
        }
        ds41_attn_query_q(ctx, cfg, lw, rope, b->cq + Q0 * cfg->q_lora_rank, (int)(N - Q0), b->pos + Q0, b->q + Q0 * HD);
        if (side) ds41_side_wait(e->side);
        if (ix && ctx->prof) ctx->prof[DS41_PROF_INDEXER] += j.seconds;   /* its own time (overlapped when on the side) */
        if (j.rc) { *err = j.err; return -1; }
    }
    /* a prompt part with no rows in this layer takes no part in it */
    int skip0 = k0 >= fs->T[0];
    double t0 = ctx->prof ? ds41_prof_now() : 0.0;
    if (ctx->bd) ds41_bd_enter(ctx, DS41_BD_SPARSE, 0);
    int arc = 0;
    for (int i = skip0; i < fs->count && !arc; i++) {
        int c = i == 0;
        arc = attend(fs->ss[i], &fs->v[i], l, c ? q0 : 0, c ? lo : 0, fs->T[i], fs->ss[i]->cache.pos, fs->layout[i], err);
    }
    if (ctx->bd) ds41_bd_leave(ctx);
    if (arc) return -1;
    if (ctx->prof) ctx->prof[DS41_PROF_SPARSE] += ds41_prof_now() - t0;
    if (N > Q0) ds41_attn_output(ctx, cfg, lw, rope, b->o + Q0 * HD, (int)(N - Q0), b->pos + Q0, b->wos, b->s.y + Q0 * dim);
    for (int i = skip0; i < fs->count; i++)
        ring_store(fs->ss[i], &fs->v[i], l, i == 0 ? k0 : 0, fs->T[i], fs->ss[i]->cache.pos, fs->layout[i]);
    return 0;
}
