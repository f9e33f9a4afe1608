/* ds41 prefix-cache restore: see restore.h. */
#include "restore.h"

#include <stdlib.h>
#include <string.h>

#include "dist_pipe.h"
#include "formats.h"

long long ds41_seq_replay_rows(const ds41_config *cfg, int mode, long long M) {
    long long W = cfg->window, L = cfg->n_layers;
    long long R = mode == DS41_RESTORE_APPROX ? W : W + (L - 1) * (W - 1);
    return R < M ? R : M;
}

long long ds41_decoder_stream_rows(const ds41_config *cfg, long long M) {
    long long W = cfg->window, L = cfg->n_layers, D = cfg->first_decoder_layer;
    if (D < 1 || D >= L) return 0;
    for (int k = 0; k < cfg->n_dspark_targets; k++)
        if (cfg->dspark_targets[k] < D) return 0;
    long long R = W + (L - D - 1) * (W - 1);
    return R < M ? R : M;
}

int ds41_restore_supported(const ds41_config *cfg) {
    for (int i = 0; i < cfg->n_kv_sources; i++) {
        int r = cfg->compress_ratios[cfg->kv_sources[i]];
        if (r < 1 || DS41_PAGE_TOKENS % r) return 0;
    }
    return 1;
}

int ds41_store_here(const ds41_engine *e, int i) {
    return !e->pipe || ds41_pipe_holds_store(e->pipe, i, e->cfg->kv_sources[i]);
}

/* The checks both entries make, then the pages of the M tokens attached to every store. */
static int attach_pages(ds41_seq *s, const int32_t *ids, long long M, uint8_t *const *pages, ds41_err *err) {
    const ds41_config *cfg = s->e->cfg;
    ds41_cache *c = &s->cache;
    if (c->pos != 0) return ds41_errf(err, "restore: the sequence holds %lld tokens (needs a fresh one)", c->pos);
    if (M < DS41_PAGE_TOKENS || M % DS41_PAGE_TOKENS || M > c->max_pos)
        return ds41_errf(err, "restore: %lld tokens (whole %d-token blocks within the context %lld)", M,
                         DS41_PAGE_TOKENS, c->max_pos);
    if (!ds41_restore_supported(cfg)) return ds41_errf(err, "restore: a KV source's ratio does not divide %d", DS41_PAGE_TOKENS);
    for (long long i = 0; i < M; i++)
        if (ids[i] < 0 || ids[i] >= cfg->vocab_size)
            return ds41_errf(err, "restore: token id %d at position %lld is outside the vocabulary", ids[i], i);
    int nb = (int)(M / DS41_PAGE_TOKENS);
    for (int i = 0; i < c->n_stores; i++) {
        ds41_kv_store *st = &c->stores[i];
        if (!ds41_store_here(s->e, i)) continue;   /* --split layers: another stage's layers */
        for (int b = 0; b < nb; b++)
            if (ds41_store_attach_page(st, b, pages[(size_t)b * c->n_stores + i], err)) return -1;
        st->n_entries = M / st->ratio;
    }
    return 0;
}

/* Engram history after position P - 1 (compressed ids, most recent first; 0 before position 0;
 * image positions, img[p] != 0 for p < n_img, are dead tokens as the forward records them). */
static void history_at(const ds41_engine *e, const int32_t *ids, const uint8_t *img, size_t n_img, long long P,
                       int32_t hist[16]) {
    for (int k = 0; k < 16; k++) {
        long long p = P - 1 - k;
        hist[k] = p < 0 ? 0 : img && p < (long long)n_img && img[p] ? DS41_ENGRAM_DEAD : e->token_map[ids[p]];
    }
}

/* The replay forward over the last R of the M positions whose pages are attached: the state at
 * its start (position, Engram history from the ids, the published index-K owner a prefill of
 * M - R tokens leaves: a one-shot prefill starts from none), then the forward in mode RESTORE. */
static int replay(ds41_seq *s, const int32_t *ids, long long M, long long R, int mode, int want_logits,
                  const ds41_restore_img *im, ds41_err *err) {
    ds41_engine *e = s->e;
    ds41_cache *c = &s->cache;
    long long P0 = M - R;
    /* the image rows the replay recomputes take their embeddings, as in the prefill */
    uint8_t *rimg = NULL;
    if (im && im->img && (long long)im->n > P0) {
        if (!im->emb) return ds41_errf(err, "restore: image positions without embeddings");
        if (!e->w->layers[0].gate_bias_vl) return ds41_errf(err, "restore: image positions need gate.bias_vl");
        if (!(rimg = calloc((size_t)R, 1))) return ds41_errf(err, "restore: out of memory");
        for (long long t = 0; t < R && P0 + t < (long long)im->n; t++) rimg[t] = im->img[P0 + t] != 0;
        s->ov_img = rimg;
        s->ov_emb = im->emb + (size_t)P0 * e->cfg->dim;
    }
    c->pos = P0;
    if (e->has_engram) history_at(e, ids, im ? im->img : NULL, im ? im->n : 0, P0, c->hist);
    c->ik_owner = P0 > 0 ? ds41_ik_owner_after(e->cfg, -1, 0, P0 - 1, e->cfg->n_layers - 1) : -1;
    ds41_prefill_mode saved = s->prefill;
    s->prefill = DS41_PREFILL_RESTORE;
    s->restore = mode;
    int rc = ds41_forward(s, ids + P0, (int)R, want_logits, err);
    s->restore = 0;
    s->prefill = saved;
    s->ov_img = NULL;
    s->ov_emb = NULL;
    free(rimg);
    return rc;
}

int ds41_seq_restore(ds41_seq *s, const int32_t *ids, long long M, uint8_t *const *pages, int mode, int want_logits,
                     const ds41_restore_img *im, ds41_err *err) {
    if (mode != DS41_RESTORE_EXACT && mode != DS41_RESTORE_APPROX) return ds41_errf(err, "restore: mode %d", mode);
    if (attach_pages(s, ids, M, pages, err)) return -1;
    return replay(s, ids, M, ds41_seq_replay_rows(s->e->cfg, mode, M), mode, want_logits, im, err);
}

/* The decoder split's install: the decoder layers on the stream rows [M - S, M), from the
 * first decoder layer D with its input as shipped. It is the prefix cache's exact replay (mode
 * RESTORE: every KV source's entries restored, the CED row reach on every layer) with the
 * layers before D taken from the prefill node: S is the reach of layer D's keys in that plan,
 * so every row it computes sees the lists of a one-shot prefill, and the rings, history, owner
 * and DSpark context it leaves are a local prefill's, bit for bit. */
static int decoder_half(ds41_seq *s, const int32_t *ids, long long M, const ds41_resume_state *st, ds41_err *err) {
    const ds41_config *cfg = s->e->cfg;
    long long S = st->stream_rows;
    size_t xw = (size_t)cfg->hc_mult * cfg->dim, n = (size_t)S * (xw + (size_t)cfg->hc_mult);
    float *x = malloc(n * sizeof(float));   /* aligned copies of the payload's FP32 rows */
    if (!x) return ds41_errf(err, "install: out of memory for %lld decoder stream rows", S);
    memcpy(x, st->stream, n * sizeof(float));
    s->from_layer = cfg->first_decoder_layer;
    s->from_X = x;
    s->from_pre = x + (size_t)S * xw;
    int rc = replay(s, ids, M, S, DS41_RESTORE_EXACT, 0, NULL, err);
    s->from_layer = 0;
    s->from_X = s->from_pre = NULL;
    free(x);
    if (rc) return -1;
    /* the encoder's sources emitted on the prefill node: its owner is the one a prefill leaves */
    s->cache.ik_owner = st->ik_owner;
    return 0;
}

int ds41_seq_install(ds41_seq *s, const int32_t *ids, long long M, uint8_t *const *pages, const ds41_resume_state *st,
                     ds41_err *err) {
    ds41_engine *e = s->e;
    const ds41_config *cfg = e->cfg;
    ds41_cache *c = &s->cache;
    if (st->ik_owner < -1 || st->ik_owner >= cfg->n_layers)
        return ds41_errf(err, "install: index-K owner %d outside -1 .. %d", st->ik_owner, cfg->n_layers - 1);
    if (st->mh_rows < 0 || st->mh_rows > cfg->window || (st->mh_rows > 0 && cfg->n_dspark_targets < 1))
        return ds41_errf(err, "install: %d DSpark context rows (at most %d)", st->mh_rows,
                         cfg->n_dspark_targets > 0 ? cfg->window : 0);
    if (attach_pages(s, ids, M, pages, err)) return -1;
    /* the history is a function of the ids the decode node holds: a shipped one that differs is
     * a peer's bug, never something to decode from */
    int32_t h[16] = { 0 };
    if (e->has_engram) history_at(e, ids, NULL, 0, M, h);
    if (memcmp(h, st->hist, sizeof h))
        return ds41_errf(err, "install: the shipped Engram history is not the one the prompt's last tokens give");
    long long S = st->stream_rows;
    if (S < 0 || (S > 0 && (S != ds41_decoder_stream_rows(cfg, M) || st->mh_rows > 0)))
        return ds41_errf(err, "install: %lld decoder stream rows (%lld for %lld tokens, no context rows with them)", S,
                         ds41_decoder_stream_rows(cfg, M), M);
    size_t ring = (size_t)cfg->window * c->rings[0].rec_bytes;
    for (int l = 0; l < (S > 0 ? cfg->first_decoder_layer : cfg->n_layers); l++) {
        if ((size_t)c->rings[l].slots * c->rings[l].rec_bytes != ring)
            return ds41_errf(err, "install: ring %d is not %d x %d bytes", l, cfg->window, c->rings[0].rec_bytes);
        memcpy(c->rings[l].rec, st->rings + (size_t)l * ring, ring);
    }
    const uint8_t *cp = st->comp;
    for (int i = 0; i < c->n_comp; i++) {
        size_t n = (size_t)c->comp[i].ratio * c->comp[i].dim * sizeof(float);
        memcpy(c->comp[i].kv, cp, n);
        memcpy(c->comp[i].sc, cp + n, n);
        cp += 2 * n;
    }
    if (S > 0) return decoder_half(s, ids, M, st, err);
    memcpy(c->hist, h, sizeof c->hist);
    c->ik_owner = st->ik_owner;
    c->pos = M;
    /* the context rows as the forward left them (the session seeds the DSpark rings from them) */
    free(s->main_hidden);
    s->main_hidden = NULL;
    s->mh_rows = 0;
    if (st->mh_rows > 0) {
        size_t w = (size_t)cfg->n_dspark_targets * cfg->dim, nv = (size_t)st->mh_rows * w;
        s->main_hidden = malloc(nv * sizeof(float));
        if (!s->main_hidden) return ds41_errf(err, "install: out of memory");
        for (size_t i = 0; i < nv; i++) {
            uint16_t b;
            memcpy(&b, st->mh + 2 * i, 2);
            s->main_hidden[i] = ds41_bf16_to_f32(b);
        }
        s->mh_rows = st->mh_rows;
        s->mh_pos0 = M - st->mh_rows;
    }
    return 0;
}
