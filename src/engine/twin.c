/* The cost-faithful twin without CSA2's cross-layer sharing, for ds41 bench --configs only
 * (docs/performance.md, "The four configurations"). CSA2 lets a Reuse layer attend to another
 * layer's compressed KV with that layer's top-k, and a Reindex layer score another layer's
 * index K; only the KV sources compute and hold KV. The twin gives every layer with a compress
 * ratio its own: its own compressor, index K, store and indexer, with the projection weights
 * of the layer it used to share with (the KV source's compressor and index-K projection, the
 * top-k source's indexer query), since the checkpoint holds no others. Its costs are those of
 * a model without the sharing; its numbers are not a model's.
 *
 * Where the layer's compressor reads: an encoder layer reads its own attention input, as a
 * KV source does. A decoder layer reads the first decoder layer's, that is the encoder's
 * output, because CED projects the decoder's global KV from the encoder (spec 4.1): a CED
 * prefill can then still skip decoder rows, and the twin's prefill with CED costs what CED
 * with per-layer decoder KV costs. Those compressors run when the first decoder layer does
 * (fwd_attn.c, twin_kv_at). With the same input and weights a decoder layer's entries equal
 * the first decoder layer's, and its indexer (the top-k source's weights and candidate
 * filter) picks what the source picked, so the twin's decoder attends to the same values; the
 * encoder's Reuse layers do not (their own inputs), so the twin's tokens differ from the
 * model's.
 *
 * Nothing here runs unless the bench turns the twin on: ds41_engine_twin swaps the engine's
 * plan and weight table, between sessions, and swaps them back. */
#include "forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds41.h"

struct ds41_twin {
    ds41_config cfg;              /* the engine's, with its own plan and source lists */
    ds41_weights w;               /* the engine's, with its own layer table (views borrowed) */
    const ds41_config *plain_cfg;
    const ds41_weights *plain_w;
};

static void twin_free(struct ds41_twin *t) {
    if (!t) return;
    free(t->cfg.layers);
    free(t->w.layers);
    free(t);
}

/* The twin of plan p (weights w): see the file comment. */
static struct ds41_twin *twin_build(const ds41_config *c, const ds41_weights *w, ds41_err *err) {
    int L = c->n_layers, total = c->n_layers + c->n_mtp, n_src = 0;
    for (int l = 0; l < L; l++) n_src += c->compress_ratios[l] > 0;
    if (n_src > DS41_MAX_LIST) {
        ds41_errf(err, "CSA2 twin: %d compressed layers, at most %d", n_src, DS41_MAX_LIST);
        return NULL;
    }
    struct ds41_twin *t = calloc(1, sizeof *t);
    if (!t) { ds41_errf(err, "out of memory"); return NULL; }
    t->cfg = *c;
    t->w = *w;
    t->cfg.layers = malloc((size_t)total * sizeof *t->cfg.layers);
    t->w.layers = malloc((size_t)total * sizeof *t->w.layers);
    if (!t->cfg.layers || !t->w.layers) { twin_free(t); ds41_errf(err, "out of memory"); return NULL; }
    memcpy(t->cfg.layers, c->layers, (size_t)total * sizeof *t->cfg.layers);
    memcpy(t->w.layers, w->layers, (size_t)total * sizeof *t->w.layers);
    t->cfg.n_kv_sources = t->cfg.n_index_sources = 0;
    for (int l = 0; l < L; l++) {
        ds41_layer_plan *p = &t->cfg.layers[l];
        const ds41_layer_plan *o = &c->layers[l];
        if (o->ratio <= 0) continue;
        t->cfg.kv_sources[t->cfg.n_kv_sources++] = l;
        t->cfg.index_sources[t->cfg.n_index_sources++] = l;
        if (o->is_kv_source) continue;   /* a KV source already computes and holds its own */
        ds41_layer_weights *lw = &t->w.layers[l];
        const ds41_layer_weights *kw = &w->layers[o->kv_source], *iw = &w->layers[o->topk_source];
        lw->comp_norm = kw->comp_norm;
        lw->comp_wkv = kw->comp_wkv;
        lw->comp_wgate = kw->comp_wgate;
        lw->idx_k_norm = kw->idx_k_norm;
        lw->idx_wk = kw->idx_wk;
        lw->idx_weights_proj = iw->idx_weights_proj;
        lw->idx_wq_b = iw->idx_wq_b;
        p->mode = DS41_MODE_FULL;
        p->kv_source = p->topk_source = p->index_k_source = l;
        p->is_index_source = 1;
        p->uses_candidates = c->layers[o->topk_source].uses_candidates;
        if (p->part == DS41_PART_DECODER) p->twin_kv_at = c->first_decoder_layer;
        else p->is_kv_source = 1;
    }
    return t;
}

int ds41_engine_twin(ds41_engine *e, int on, ds41_err *err) {
    if (!on) {
        if (e->twin) { e->cfg = e->twin->plain_cfg; e->w = e->twin->plain_w; }
        return 0;
    }
    if (!e->twin) {
        if (!(e->twin = twin_build(e->cfg, e->w, err))) return -1;
        e->twin->plain_cfg = e->cfg;
        e->twin->plain_w = e->w;
    }
    e->cfg = &e->twin->cfg;
    e->w = &e->twin->w;
    return 0;
}

void ds41_engine_twin_free(ds41_engine *e) {
    ds41_engine_twin(e, 0, NULL);
    twin_free(e->twin);
    e->twin = NULL;
}

int ds41_engine_set_csa2_twin(ds41_engine *e, int on, char *errbuf, size_t errcap) {
    ds41_err err;
    if (!ds41_engine_twin(e, on, &err)) return 0;
    if (errbuf && errcap) snprintf(errbuf, errcap, "%s", err.msg);
    return -1;
}
