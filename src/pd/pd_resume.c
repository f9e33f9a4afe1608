/* ds41 resume state over the wire (pd.h, docs/pd.md): a sequence's bounded state at a block end
 * packed into a RESUME payload on the prefill node (src/store/kvx_resume.h), and a received
 * payload checked against this node's own cache and turned into the engine's install view
 * (restore.h ds41_resume_state) on the decode node. */
#include "pd.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "kvx_resume.h"
#include "restore.h"

int ds41_pd_geom(const ds41_engine *e, const ds41_cache *c, ds41_kvx_geom *g, ds41_err *err) {
    const ds41_config *cfg = e->cfg;
    memset(g, 0, sizeof *g);
    if (c->n_comp > DS41_KVX_MAX_COMP) return ds41_errf(err, "resume state: %d compressors (at most %d)", c->n_comp, DS41_KVX_MAX_COMP);
    g->n_rings = cfg->n_layers;
    g->slots = c->rings[0].slots;
    g->rec_bytes = c->rings[0].rec_bytes;
    for (int l = 0; l < cfg->n_layers; l++)
        if (c->rings[l].slots != g->slots || c->rings[l].rec_bytes != g->rec_bytes)
            return ds41_errf(err, "resume state: ring %d is %d x %d bytes, ring 0 %d x %d", l, c->rings[l].slots,
                             c->rings[l].rec_bytes, g->slots, g->rec_bytes);
    g->n_comp = c->n_comp;
    for (int i = 0; i < c->n_comp; i++) {
        g->comp_layer[i] = c->comp[i].layer;
        g->comp_ratio[i] = c->comp[i].ratio;
        g->comp_dim[i] = c->comp[i].dim;
    }
    g->n_layers = cfg->n_layers;
    g->n_hist_ids = e->has_engram ? e->n_compressed : 0;
    g->mh_width = cfg->n_dspark_targets > 0 ? cfg->n_dspark_targets * cfg->dim : 0;
    /* the decoder split, where it applies (restore.h ds41_decoder_stream_rows) */
    long long smax = ds41_decoder_stream_rows(cfg, (long long)1 << 40);
    if (smax > 0 && smax <= INT32_MAX) {
        g->stream_layer = cfg->first_decoder_layer;
        g->stream_width = cfg->hc_mult * (cfg->dim + 1);
        g->stream_max = (int)smax;
    }
    return 0;
}

uint8_t *ds41_pd_resume_pack(const ds41_seq *q, int with_context, const float *stream, size_t *n, ds41_err *err) {
    const ds41_cache *c = &q->cache;
    ds41_kvx_geom g;
    if (ds41_pd_geom(q->e, c, &g, err)) return NULL;
    int srows = stream ? ds41_kvx_stream_rows(&g, c->pos) : 0;
    if (stream && srows < 1) {
        ds41_errf(err, "resume state: the decoder split does not apply to this checkpoint");
        return NULL;
    }
    /* the last `window` context rows: all a DSpark ring keeps of them (none with a stream: the
     * decode node's decoder forward taps them) */
    int mh = with_context && !stream && g.mh_width && q->main_hidden ? q->mh_rows : 0;
    if (mh > g.slots) mh = g.slots;
    if (mh > 0 && q->mh_pos0 + q->mh_rows != c->pos) {
        ds41_errf(err, "resume state: context rows end at %lld, the sequence at %lld", q->mh_pos0 + q->mh_rows, c->pos);
        return NULL;
    }
    size_t bytes = ds41_kvx_resume_bytes(&g, mh, srows);
    uint8_t *out = bytes ? malloc(bytes) : NULL;
    if (!out) { ds41_errf(err, "resume state: out of memory (%zu bytes)", bytes); return NULL; }
    ds41_kvx_resume r = { .pos = c->pos, .mh_pos0 = c->pos - mh, .ik_owner = c->ik_owner, .mh_rows = mh,
                          .stream_rows = srows };
    memcpy(r.hist, c->hist, sizeof r.hist);
    ds41_kvx_resume_write_head(&g, &r, out);
    size_t ring = (size_t)g.slots * g.rec_bytes;
    for (int l = 0; l < (srows ? g.stream_layer : g.n_rings); l++)
        memcpy(out + r.rings_off + (size_t)l * ring, c->rings[l].rec, ring);
    if (srows) memcpy(out + r.stream_off, stream, (size_t)srows * g.stream_width * sizeof(float));
    uint8_t *cp = out + r.comp_off;
    for (int i = 0; i < c->n_comp; i++) {
        size_t nb = (size_t)c->comp[i].ratio * c->comp[i].dim * sizeof(float);
        memcpy(cp, c->comp[i].kv, nb);
        memcpy(cp + nb, c->comp[i].sc, nb);
        cp += 2 * nb;
    }
    /* the context rows are BF16-rounded FP32 (forward.c dspark_tap): their upper halves carry them */
    const float *src = q->main_hidden ? q->main_hidden + (size_t)(q->mh_rows - mh) * g.mh_width : NULL;
    for (size_t i = 0; i < (size_t)mh * g.mh_width; i++) {
        uint32_t b;
        memcpy(&b, src + i, 4);
        if (b & 0xffffu) {
            free(out);
            ds41_errf(err, "resume state: context value %zu is not a BF16 value", i);
            return NULL;
        }
        uint16_t h = (uint16_t)(b >> 16);
        memcpy(out + r.mh_off + 2 * i, &h, 2);
    }
    *n = bytes;
    return out;
}

int ds41_pd_resume_view(const ds41_kvx_geom *g, const uint8_t *p, size_t n, long long M, ds41_resume_state *st,
                        ds41_err *err) {
    ds41_kvx_resume r;
    char why[256];
    if (ds41_kvx_resume_parse(p, n, g, M, &r, why, sizeof why)) return ds41_errf(err, "%s", why);
    memset(st, 0, sizeof *st);
    st->rings = p + r.rings_off;
    st->comp = p + r.comp_off;
    st->mh = p + r.mh_off;
    st->mh_rows = r.mh_rows;
    st->ik_owner = r.ik_owner;
    memcpy(st->hist, r.hist, sizeof st->hist);
    st->stream_rows = r.stream_rows;
    st->stream = r.stream_rows ? p + r.stream_off : NULL;
    return 0;
}
